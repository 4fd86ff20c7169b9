"""The OOM-risk score: 0-1 per GPU and the engine on it, with the reasons behind it.

High memory use alone is not a risk: vLLM preallocates `gpu_memory_utilization` of the
GPU (0.9 by default) on purpose and lives inside it. What makes an out-of-memory crash
likely is each of:

* headroom: free memory below `oom_free_margin_ratio` of the total;
* trend: free memory falling while the engine is already beyond its budget (or the
  headroom is gone), scored by the time to full from a least-squares fit;
* budget: usage beyond the engine's own `gpu_memory_utilization` share;
* fragmentation: the allocator holds free memory only in blocks smaller than a typical
  request, or it had to retry allocations; an allocator OOM already counted scores 1;
* sharing: several processes on one GPU (outside MIG), each unaware of the other's budget;
  the reason names the tenant whose memory grows most. Memory the engines' own processes
  do not hold (another tenant's) is not counted against their budget.

Reasons combine like independent probabilities: risk = 1 - prod(1 - weight_i).

A full KV cache is not among them: vLLM allocates its KV cache up front, inside its
budget, and a full cache makes it preempt sequences, not run out of memory. That has its
own finding, `memory/kv_cache_saturated`.
"""

from __future__ import annotations

from collections.abc import Callable

from exporter.diagnosis.fmt import duration, value_text
from exporter.diagnosis.frame import AllocFrame, EngineFrame, Frame, GpuFrame, MigFrame
from exporter.diagnosis.history import History, increase, slope
from exporter.diagnosis.model import OomRisk
from exporter.diagnosis.thresholds import Thresholds


def _clamp(x: float) -> float:
    return min(1.0, max(0.0, x))


def combine(weights: list[float]) -> float:
    left = 1.0
    for w in weights:
        left *= 1.0 - _clamp(w)
    return _clamp(1.0 - left)


def engines_on(frame: Frame, g: GpuFrame) -> list[EngineFrame]:
    return [e for e in frame.engines if g.index in e.gpus]


def _instance(g: GpuFrame, e: EngineFrame | None) -> MigFrame | None:
    if e is None or not g.mig_enabled:
        return None
    return next((m for m in g.mig if m.uuid in e.gpu_uuids), None)


_LAST: tuple[Frame, History, Thresholds, list[OomRisk]] | None = None


def oom_risks(frame: Frame, history: History, th: Thresholds) -> list[OomRisk]:
    """Every GPU's (and engine's) score in this frame; worked out once per frame, for the
    rule and the diagnoser both ask within one step (frames are immutable, and each is
    stepped once)."""
    global _LAST
    last = _LAST
    if last is not None and last[0] is frame and last[1] is history and last[2] is th:
        return last[3]
    out = _risks(frame, history, th)
    _LAST = (frame, history, th, out)
    return out


def _risks(frame: Frame, history: History, th: Thresholds) -> list[OomRisk]:
    out = []
    for g in frame.gpus:
        if not g.up:
            continue
        engines = engines_on(frame, g)
        subjects: list[EngineFrame | None] = [*engines] if engines else [None]
        for e in subjects:
            out.append(gpu_engine_risk(frame, history, th, g, e, engines))
    return out


def gpu_engine_risk(
    frame: Frame,
    history: History,
    th: Thresholds,
    g: GpuFrame,
    e: EngineFrame | None,
    engines: list[EngineFrame],
) -> OomRisk:
    weights: list[float] = []
    reasons: list[str] = []
    ttf: float | None = None
    inst = _instance(g, e)
    if inst is not None:
        total, used = inst.memory_total_bytes, inst.memory_used_bytes
        free = None if total is None or used is None else total - used
        sharers = [e] if e is not None else []
    else:
        total, used, free = g.memory_total_bytes, g.memory_used_bytes, g.free_bytes
        sharers = engines
    target = e.target if e is not None else ""

    if total and used is not None and free is not None:
        low = free < th.oom_free_margin_ratio * total
        if low:
            weights.append(th.oom_low_headroom_weight)
            reasons.append(
                f"only {value_text(free, 'bytes')} free ({value_text(free / total, 'ratio')} of "
                f"{value_text(total, 'bytes')}), margin {value_text(th.oom_free_margin_ratio, 'ratio')}"
            )
        budgets = [b for b in (engine_budget(history, x) for x in sharers) if b is not None]
        over = False
        if budgets:
            budget = min(1.0, sum(budgets)) * total
            foreign = 0.0 if inst is not None else sum(tenants_memory(g, engines).values())
            excess = used - foreign - budget
            if excess > th.oom_budget_tolerance_ratio * total and total > budget:
                over = True
                weights.append(_clamp(excess / (total - budget)))
                reasons.append(
                    f"using {value_text(used, 'bytes')}, {value_text(excess, 'bytes')} "
                    f"beyond the engine budget "
                    f"(gpu_memory_utilization {min(1.0, sum(budgets)):g} = {value_text(budget, 'bytes')})"
                )
        if over or low:
            ttf = _time_to_full(history, g, inst, free, th)
            if ttf is not None and ttf < th.oom_time_to_full_horizon_s:
                weights.append(_clamp(1.0 - max(0.0, ttf - 60.0) / th.oom_time_to_full_horizon_s))
                reasons.append(f"free memory falling: full in about {duration(ttf)} at the current trend")
            else:
                ttf = None

    allocators = [a for a in g.allocators if e is None or probe_of(a, e, engines)]
    for a in allocators:
        ooms = history.gpu_series(g.index, _alloc_getter(a.pid, "ooms_total"), th.oom_trend_window_s)
        retries = history.gpu_series(
            g.index, _alloc_getter(a.pid, "alloc_retries_total"), th.oom_trend_window_s
        )
        n_ooms = increase(ooms[1:], baseline=ooms[0][1]) if len(ooms) >= 2 else 0.0
        n_retries = increase(retries[1:], baseline=retries[0][1]) if len(retries) >= 2 else 0.0
        if n_ooms > 0:
            weights.append(1.0)
            reasons.append(f"pid {a.pid}: the allocator reported {n_ooms:.0f} out-of-memory errors")
            continue
        fragmented = (
            a.largest_free_block_bytes is not None
            and a.free_bytes is not None
            and a.largest_free_block_bytes < th.oom_typical_request_bytes <= a.free_bytes
            and (a.fragmentation_ratio or 0.0) >= th.oom_fragmentation_min_ratio
        )
        if fragmented:
            weights.append(th.oom_fragmentation_weight)
            reasons.append(
                f"pid {a.pid}: largest free block {value_text(a.largest_free_block_bytes, 'bytes')} below a "
                f"typical request ({value_text(th.oom_typical_request_bytes, 'bytes')}), "
                f"fragmentation {value_text(a.fragmentation_ratio, 'ratio')}"
            )
        elif n_retries > 0:
            weights.append(th.oom_fragmentation_weight)
            reasons.append(f"pid {a.pid}: {n_retries:.0f} allocation retries (cache flushed to find a block)")

    if not g.mig_enabled and g.process_count is not None and g.process_count >= 2:
        weights.append(th.oom_shared_weight)
        grower = growing_tenant(history, g, engines, th.oom_trend_window_s)
        reasons.append(
            f"{g.process_count} processes share the GPU, each with its own idea of free memory"
            + (f"; {grower}" if grower else "")
        )

    return OomRisk(
        gpu=str(g.index),
        uuid=g.uuid,
        target=target,
        ratio=round(combine(weights), 4),
        reasons=tuple(reasons),
        time_to_full_seconds=None if ttf is None else round(ttf, 1),
    )


def tenants_memory(g: GpuFrame, engines: list[EngineFrame]) -> dict[str, float]:
    """Memory each other tenant holds on the GPU, by owner: processes with an owner that no
    engine process on it has. A process without an owner may be an engine's own (a worker
    of an engine that is down, one the process tree missed), and where the engines'
    processes are unknown (stored series carry no engine pids) nothing is told apart."""
    ours = frozenset().union(*(e.pids for e in engines)) if engines else frozenset()
    if not ours:
        return {}
    our_owners = {g.process_owner[pid] for pid in ours if pid in g.process_owner}
    out: dict[str, float] = {}
    for pid, held in g.process_memory.items():
        owner = g.process_owner.get(pid)
        if pid not in ours and owner is not None and owner not in our_owners:
            out[owner] = out.get(owner, 0.0) + held
    return out


def growing_tenant(history: History, g: GpuFrame, engines: list[EngineFrame], window_s: float) -> str:
    """'<owner> holds X, +Y in the last N': the other tenant whose memory grew most over the
    window (the largest, where none grew); empty without one."""
    now = tenants_memory(g, engines)
    if not now:
        return ""
    growth = {}
    for owner in now:

        def held(x: GpuFrame, o: str = owner) -> float | None:
            return tenants_memory(x, engines).get(o)

        series = history.gpu_series(g.index, held, window_s)
        growth[owner] = series[-1][1] - series[0][1] if len(series) >= 2 else 0.0
    owner = max(now, key=lambda o: (growth[o], now[o]))
    grew = growth[owner]
    text = f"{owner} holds {value_text(now[owner], 'bytes')}"
    if grew > 0:
        text += f", {value_text(grew, 'bytes')} more than {duration(window_s)} ago"
    return text


def probe_of(a: AllocFrame, e: EngineFrame, engines: list[EngineFrame]) -> bool:
    """Whether an allocator probe's process is one of the engine's.

    By pid where the probe shares a pid namespace with the engine's processes as the
    scraper knows them (a host process, or the simulator's); else by (namespace, pid) as
    /proc maps the engine's host pids into their container's namespace. A probe neither
    can place (no /proc access, say) belongs to the engine on its GPU when exactly one
    engine runs there.
    """
    key = (a.pid_namespace or "", a.pid)
    if key in e.ns_pids:
        return True
    if any(key in x.ns_pids for x in engines):
        return False  # another engine's process
    if a.pid in e.pids and (not e.ns_pids or a.pid_namespace is None):
        return True  # nothing to map with: the pids as the scraper knows them
    if not e.pids:
        return True  # an engine without known processes: every probe on its GPU
    claimed = any(a.pid in x.pids and (not x.ns_pids or a.pid_namespace is None) for x in engines)
    on_gpu = [x for x in engines if a.uuid and a.uuid in x.gpu_uuids]
    return not claimed and len(on_gpu) == 1 and on_gpu[0] is e


def engine_budget(history: History, e: EngineFrame) -> float | None:
    """The engine's gpu_memory_utilization; the last one it reported while it is down."""
    if e.gpu_memory_utilization is not None:
        return e.gpu_memory_utilization
    known = history.engine_series(e.target, lambda x: x.gpu_memory_utilization)
    return known[-1][1] if known else None


def _alloc_getter(pid: int, name: str) -> Callable[[GpuFrame], float | None]:
    def get(g: GpuFrame) -> float | None:
        for a in g.allocators:
            if a.pid == pid:
                value: float | None = getattr(a, name)
                return value
        return None

    return get


def _time_to_full(
    history: History, g: GpuFrame, inst: MigFrame | None, free: float, th: Thresholds
) -> float | None:
    """Seconds until free memory reaches zero at the fitted trend; None unless falling."""
    if inst is None:
        series = history.gpu_series(g.index, lambda x: x.free_bytes, th.oom_trend_window_s)
    else:
        series = history.gpu_series(g.index, lambda x: _mig_free(x, inst.uuid), th.oom_trend_window_s)
    if len(series) < 3 or series[-1][0] - series[0][0] < th.oom_trend_min_span_s:
        return None
    s = slope(series)
    if s is None or s >= 0:
        return None
    return max(0.0, free) / -s


def _mig_free(g: GpuFrame, uuid: str) -> float | None:
    for m in g.mig:
        if m.uuid == uuid and m.memory_total_bytes is not None and m.memory_used_bytes is not None:
            return m.memory_total_bytes - m.memory_used_bytes
    return None
