"""`llm-gpu-exporter snapshot`: one sample as tables a person reads like nvidia-smi.

One row per GPU, then one row per inference engine with the GPUs the join put it on.
"""

from __future__ import annotations

from exporter.engines.readings import EngineGpus, Engines, EngineTargetReading
from exporter.gpu_readings import Clocks, Memory, Power, Profiling, Utilization
from exporter.snapshot import GpuState, Snapshot

GIB = 1024**3
COLUMNS = (
    "GPU",
    "Name",
    "Up",
    "Util",
    "SM act",
    "Tensor",
    "DRAM",
    "Mem used / total",
    "Power",
    "Temp",
    "SM clock",
    "Throttle",
)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def _row(g: GpuState) -> tuple[str, ...]:
    facts, util, mem = g.facts, g.get(Utilization), g.get(Memory)
    power, prof, clocks = g.get(Power), g.get(Profiling), g.get(Clocks)
    total = facts.memory_total_bytes if facts else None
    used = mem.used_bytes if mem else None
    memory = "-" if used is None or total is None else f"{used / GIB:.1f} / {total / GIB:.0f} GiB"
    watts = "-" if power is None or power.usage_watts is None else f"{power.usage_watts:.0f} W"
    temp = "-" if power is None or power.gpu_celsius is None else f"{power.gpu_celsius:.0f} C"
    clock = "-" if clocks is None or clocks.sm_hertz is None else f"{clocks.sm_hertz / 1e6:.0f} MHz"
    active = [r for r, on in (clocks.event_active or {}).items() if on] if clocks else []
    return (
        str(g.index),
        facts.get("name") if facts else "?",
        "yes" if g.up else "LOST",
        _pct(util.gpu_busy_ratio if util else None),
        _pct(prof.sm_active_ratio if prof else None),
        _pct(prof.tensor_active_ratio if prof else None),
        _pct(prof.dram_active_ratio if prof else None),
        memory,
        watts,
        temp,
        clock,
        ",".join(active) or "-",
    )


ENGINE_COLUMNS = ("Engine", "Kind", "Model", "Up", "GPUs", "Running", "Waiting", "KV cache", "Gen tok/s")


def _num(v: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _total(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _engine_row(t: EngineTargetReading, gpus: tuple[int, ...]) -> tuple[str, ...]:
    kv = [s.kv_cache_usage_ratio for s in t.series if s.kv_cache_usage_ratio is not None]
    return (
        t.target,
        t.kind or "?",
        ", ".join(t.models) or "-",
        "yes" if t.up else f"NO ({t.last_error or 'no scrape yet'})",
        ",".join(str(g) for g in gpus) or "-",
        _num(_total([s.requests_running for s in t.series])),
        _num(_total([s.requests_waiting for s in t.series])),
        _pct(max(kv) if kv else None),
        _num(_total([s.generation_tokens_per_second for s in t.series])),
    )


def _grid(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def render_table(snapshot: Snapshot) -> str:
    note = " (simulated)" if snapshot.simulated else ""
    out = [f"{len(snapshot.gpus)} GPU(s){note}", *_grid([COLUMNS, *(_row(g) for g in snapshot.gpus)])]
    targets = [t for engines in snapshot.all(Engines) for t in engines.targets]
    if targets:
        links = snapshot.get(EngineGpus)
        rows = [_engine_row(t, links.gpus_of(t.target) if links else ()) for t in targets]
        out += ["", f"{len(targets)} engine(s)", *_grid([ENGINE_COLUMNS, *rows])]
    return "\n".join(out)
