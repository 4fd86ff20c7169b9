"""`llm-gpu-exporter snapshot`: one sample as a table a person reads like nvidia-smi."""

from __future__ import annotations

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


def render_table(snapshot: Snapshot) -> str:
    rows = [COLUMNS, *(_row(g) for g in snapshot.gpus)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    note = " (simulated)" if snapshot.simulated else ""
    return f"{len(snapshot.gpus)} GPU(s){note}\n" + "\n".join(lines)
