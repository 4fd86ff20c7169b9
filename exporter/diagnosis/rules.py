"""The rules: pure functions of (frame, history, thresholds) -> candidate findings.

A rule yields one `Candidate` per subject whose condition holds in the current frame;
the Diagnoser turns candidates into findings once they held for the rule's hold time.
Rules never look at the wall clock: every time span comes from `Frame.taken_at`.
Rules are listed in `RULES` in the order the page and docs show them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from statistics import mean

from exporter.diagnosis.fmt import value_text
from exporter.diagnosis.frame import POWER_REASONS, THERMAL_REASONS, EngineFrame, Frame, GpuFrame
from exporter.diagnosis.history import History, increase, rate
from exporter.diagnosis.model import Candidate, Evidence, Rule, Scope, Subject
from exporter.diagnosis.oom import oom_risks
from exporter.diagnosis.thresholds import Thresholds

Th = Thresholds


def gpu_subject(g: GpuFrame) -> Subject:
    return Subject(gpu=str(g.index))


def engine_subject(e: EngineFrame) -> Subject:
    return Subject(target=e.target)


def _pct(v: float) -> str:
    return value_text(v, "ratio")


def _live(frame: Frame) -> Iterator[GpuFrame]:
    return (g for g in frame.gpus if g.up)


def _engine_gpus(frame: Frame, e: EngineFrame) -> list[GpuFrame]:
    return [g for g in (frame.gpu(i) for i in e.gpus) if g is not None and g.up]


# ---- hardware ------------------------------------------------------------------------


def busy_idle_sms(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        if g.util_ratio is None or g.sm_active_ratio is None:
            continue
        if g.util_ratio >= th.busy_util_min_ratio and g.sm_active_ratio < th.busy_sm_active_max_ratio:
            yield Candidate(
                gpu_subject(g),
                (
                    Evidence(
                        "GPU utilization (NVML)", g.util_ratio, "ratio", f">= {_pct(th.busy_util_min_ratio)}"
                    ),
                    Evidence(
                        "SM active (GPM)",
                        g.sm_active_ratio,
                        "ratio",
                        f"< {_pct(th.busy_sm_active_max_ratio)}",
                    ),
                ),
                f"GPU {g.index} reads {_pct(g.util_ratio)} busy, yet only "
                f"{_pct(g.sm_active_ratio)} of its SMs work",
            )


def dram_bandwidth_bound(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        if g.dram_active_ratio is None or g.dram_active_ratio < th.dram_bound_ratio:
            continue
        peak = g.dram_peak_bytes_per_second
        ev = [
            Evidence("DRAM bandwidth / peak", g.dram_active_ratio, "ratio", f">= {_pct(th.dram_bound_ratio)}")
        ]
        if peak:
            ev.append(Evidence("DRAM bandwidth", g.dram_active_ratio * peak, "bytes_per_second"))
            ev.append(Evidence(f"peak ({g.name or 'this model'})", peak, "bytes_per_second"))
        if g.sm_active_ratio is not None:
            ev.append(Evidence("SM active", g.sm_active_ratio, "ratio"))
        yield Candidate(
            gpu_subject(g),
            tuple(ev),
            f"GPU {g.index} moves {_pct(g.dram_active_ratio)} of its peak memory bandwidth",
        )


def thermal_throttle(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        reasons = [r for r in g.throttle_reasons or () if r in THERMAL_REASONS]
        if not reasons:
            continue
        ev = [Evidence("clock-event reasons", ", ".join(reasons))]
        if g.temperature_celsius is not None:
            ev.append(Evidence("GPU temperature", g.temperature_celsius, "celsius"))
        if g.sm_clock_ratio is not None:
            ev.append(Evidence("SM clock / max", g.sm_clock_ratio, "ratio"))
        yield Candidate(gpu_subject(g), tuple(ev), f"GPU {g.index} clocks held down by {', '.join(reasons)}")


def power_throttle(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        reasons = [r for r in g.throttle_reasons or () if r in POWER_REASONS]
        if not reasons or g.sm_clock_ratio is None:
            continue
        if g.sm_clock_ratio >= th.power_throttle_clock_max_ratio:
            continue
        ev = [
            Evidence("clock-event reasons", ", ".join(reasons)),
            Evidence(
                "SM clock / max", g.sm_clock_ratio, "ratio", f"< {_pct(th.power_throttle_clock_max_ratio)}"
            ),
        ]
        if g.power_watts is not None:
            ev.append(Evidence("power", g.power_watts, "watts"))
        if g.power_limit_watts is not None:
            ev.append(Evidence("power limit", g.power_limit_watts, "watts"))
        yield Candidate(
            gpu_subject(g), tuple(ev), f"GPU {g.index} power-capped to {_pct(g.sm_clock_ratio)} of its clock"
        )


def pcie_replays(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        if g.pcie_replays_total is None:
            continue
        oldest = history.oldest.taken_at if history.oldest else frame.taken_at
        start = max(oldest, frame.taken_at - th.pcie_replay_window_s)
        before = history.last_gpu(g.index, lambda x: x.pcie_replays_total, at=start)
        if before is not None and before == g.pcie_replays_total:
            continue  # the usual case: not one replay in the window
        series = history.gpu_series(g.index, lambda x: x.pcie_replays_total, th.pcie_replay_window_s)
        if len(series) < 2 or series[-1][0] - series[0][0] < min(60.0, th.pcie_replay_window_s):
            continue
        r = rate(series)
        if r is None or r * 60 <= th.pcie_replays_per_minute:
            continue
        span = series[-1][0] - series[0][0]
        yield Candidate(
            gpu_subject(g),
            (
                Evidence("replays per minute", r * 60, "", f"> {th.pcie_replays_per_minute:g}"),
                Evidence(
                    f"replays in the last {value_text(span, 'seconds')}",
                    increase(series[1:], baseline=series[0][1]),
                ),
            ),
            f"GPU {g.index}'s PCIe link replays {r * 60:.0f} packets a minute",
        )


def xid_increase(history: History, index: int, xids: tuple[int, ...], since: float) -> dict[int, int]:
    """XID events per id that arrived after `since`.

    The exporter counts XIDs from zero at its start, so a GPU without a frame before
    `since` starts from zero. A lost GPU may show no counts any more: its last counts
    while it answered are the current ones.
    """
    latest = history.latest
    g = latest.gpu(index) if latest is not None else None
    if g is None or (g.up and not g.xid_counts):
        return {}  # no XID data for this GPU, or none seen
    now = history.last_gpu(index, lambda x: x.xid_counts or None)
    if not now or not any(now.get(x, 0) for x in xids):
        return {}
    start = history.last_gpu(index, lambda x: x.xid_counts or None, at=since) or {}
    return {x: now[x] - start.get(x, 0) for x in xids if now.get(x, 0) > start.get(x, 0)}


def _xid_candidates(
    frame: Frame, history: History, th: Th, xids: tuple[int, ...], what: str
) -> Iterator[Candidate]:
    since = frame.taken_at - th.xid_window_s
    for g in frame.gpus:  # lost GPUs too: their XID came just before
        seen = sorted(xid_increase(history, g.index, xids, since).items())
        if seen:
            yield Candidate(
                gpu_subject(g),
                (
                    *(Evidence(f"XID {xid} events", n, "count") for xid, n in seen),
                    Evidence("window", th.xid_window_s, "seconds"),
                ),
                f"GPU {g.index} reported XID {', '.join(str(x) for x, _ in seen)} ({what})",
            )


def xid_fatal(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    return _xid_candidates(frame, history, th, th.xid_fatal, "needs a reset or replacement")


def ecc_uncorrectable(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    since = frame.taken_at - th.ecc_window_s
    oldest = history.oldest
    for g in _live(frame):
        n = 0.0
        now = g.ecc_uncorrected_total
        if now is not None and oldest is not None:
            # the counter is volatile (since driver load): count only growth seen here
            then = history.last_gpu(
                g.index, lambda x: x.ecc_uncorrected_total, at=max(since, oldest.taken_at)
            )
            n = max(0.0, now - then) if then is not None else 0.0
        if n <= 0 and not g.remap_failed:
            continue
        ev = [Evidence("new uncorrectable ECC errors", n, "count", "> 0")]
        if g.remap_failed:
            ev.append(Evidence("row remapping failed", "yes"))
        yield Candidate(gpu_subject(g), tuple(ev), f"GPU {g.index} hit uncorrectable memory errors")


def gpu_lost(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in frame.gpus:
        if not g.up:
            yield Candidate(
                gpu_subject(g),
                (Evidence("NVML answers", "no"), Evidence("UUID", g.uuid or "unknown")),
                f"GPU {g.index} stopped answering NVML",
            )


def numa_mismatch(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        if not e.cpu_numa_nodes:
            continue
        for g in _engine_gpus(frame, e):
            if g.numa_node is None or g.numa_node in e.cpu_numa_nodes:
                continue
            yield Candidate(
                Subject(gpu=str(g.index), target=e.target),
                (
                    Evidence("GPU NUMA node", g.numa_node, "count"),
                    Evidence("engine CPUs on NUMA nodes", ", ".join(str(n) for n in e.cpu_numa_nodes)),
                ),
                f"{e.name} runs on CPUs of NUMA node {e.cpu_numa_nodes[0]}, GPU "
                f"{g.index} hangs off node {g.numa_node}",
            )


# ---- kernel --------------------------------------------------------------------------


def low_tensor_activity(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        if g.sm_active_ratio is None or g.tensor_active_ratio is None:
            continue
        if (
            g.sm_active_ratio >= th.tensor_sm_active_min_ratio
            and g.tensor_active_ratio < th.tensor_active_max_ratio
        ):
            yield Candidate(
                gpu_subject(g),
                (
                    Evidence(
                        "SM active", g.sm_active_ratio, "ratio", f">= {_pct(th.tensor_sm_active_min_ratio)}"
                    ),
                    Evidence(
                        "tensor-core active",
                        g.tensor_active_ratio,
                        "ratio",
                        f"< {_pct(th.tensor_active_max_ratio)}",
                    ),
                ),
                f"GPU {g.index}'s SMs are {_pct(g.sm_active_ratio)} busy with tensor cores nearly idle",
            )


def low_mfu_mbu(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        gpus = _engine_gpus(frame, e)
        if (
            not gpus
            or e.estimated_flops_per_gpu_total is None
            or e.estimated_read_bytes_per_gpu_total is None
        ):
            continue
        utils = [g.util_ratio for g in gpus if g.util_ratio is not None]
        if not utils or mean(utils) < th.mfu_busy_util_min_ratio:
            continue
        flops = rate(
            history.engine_series(e.target, lambda x: x.estimated_flops_per_gpu_total, th.rate_window_s)
        )
        read = rate(
            history.engine_series(e.target, lambda x: x.estimated_read_bytes_per_gpu_total, th.rate_window_s)
        )
        peak_f, peak_b = gpus[0].peak_flops, gpus[0].dram_peak_bytes_per_second
        if flops is None or read is None or not peak_f or not peak_b:
            continue
        mfu, mbu = flops / peak_f, read / peak_b
        if mfu < th.mfu_min_ratio and mbu < th.mbu_min_ratio:
            yield Candidate(
                engine_subject(e),
                (
                    Evidence("MFU (achieved / peak FLOP/s)", mfu, "ratio", f"< {_pct(th.mfu_min_ratio)}"),
                    Evidence("MBU (achieved / peak bandwidth)", mbu, "ratio", f"< {_pct(th.mbu_min_ratio)}"),
                    Evidence("GPU utilization", mean(utils), "ratio"),
                ),
                f"{e.name} keeps its GPUs busy at {_pct(mfu)} MFU and {_pct(mbu)} MBU",
            )


# ---- memory --------------------------------------------------------------------------


def oom_risk(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for risk in oom_risks(frame, history, th):
        if risk.ratio < th.oom_finding_ratio:
            continue
        ev = [Evidence("OOM risk", risk.ratio, "ratio", f">= {_pct(th.oom_finding_ratio)}")]
        if risk.time_to_full_seconds is not None:
            ev.append(Evidence("time to full at the current trend", risk.time_to_full_seconds, "seconds"))
        ev.extend(Evidence("reason", r) for r in risk.reasons)
        who = f"GPU {risk.gpu}"
        yield Candidate(
            Subject(gpu=risk.gpu, target=risk.target), tuple(ev), f"{who} is heading for out-of-memory"
        )


def _engine_rate(
    history: History, e: EngineFrame, get: Callable[[EngineFrame], float | None], window: float
) -> float | None:
    return rate(history.engine_series(e.target, get, window))


def kv_cache_saturated(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        if not e.up or e.kv_usage_ratio is None or e.kv_usage_ratio < th.kv_usage_min_ratio:
            continue
        pre = e.preemptions_per_second
        if pre is None:
            pre = _engine_rate(history, e, lambda x: x.preemptions_total, th.rate_window_s)
        if pre is None or pre < th.kv_preemptions_min_per_second:
            continue
        ev = [
            Evidence("KV-cache usage", e.kv_usage_ratio, "ratio", f">= {_pct(th.kv_usage_min_ratio)}"),
            Evidence("preemptions", pre, "per_second", f">= {th.kv_preemptions_min_per_second:g}/s"),
        ]
        if e.waiting is not None:
            ev.append(Evidence("waiting requests", e.waiting, "count"))
        yield Candidate(
            engine_subject(e),
            tuple(ev),
            f"{e.name}: KV cache {_pct(e.kv_usage_ratio)} full, {pre:.1f} preemptions/s",
        )


def xid_memory_fault(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    return _xid_candidates(frame, history, th, th.xid_memory, "memory fault in an application")


def allocator_fragmentation(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        for a in g.allocators:
            if a.largest_free_block_bytes is None or a.free_bytes is None:
                continue
            small = a.largest_free_block_bytes < th.oom_typical_request_bytes <= a.free_bytes
            frag = (a.fragmentation_ratio or 0.0) >= th.oom_fragmentation_min_ratio
            if not (small and frag):
                continue
            yield Candidate(
                gpu_subject(g),
                (
                    Evidence("process", a.pid, "count"),
                    Evidence("free inside reserved segments", a.free_bytes, "bytes"),
                    Evidence(
                        "largest free block",
                        a.largest_free_block_bytes,
                        "bytes",
                        f"< {value_text(th.oom_typical_request_bytes, 'bytes')}",
                    ),
                    Evidence(
                        "fragmentation",
                        a.fragmentation_ratio,
                        "ratio",
                        f">= {_pct(th.oom_fragmentation_min_ratio)}",
                    ),
                ),
                f"GPU {g.index}: pid {a.pid} has {value_text(a.free_bytes, 'bytes')} free but no block over "
                f"{value_text(a.largest_free_block_bytes, 'bytes')}",
            )
            break


# ---- scheduling ----------------------------------------------------------------------


def _sm_or_util(g: GpuFrame) -> float | None:
    return g.sm_active_ratio if g.sm_active_ratio is not None else g.util_ratio


def queue_with_idle_gpu(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        if not e.up or e.waiting is None or e.waiting < th.queue_waiting_min:
            continue
        gpus = _engine_gpus(frame, e)
        act = [v for v in (_sm_or_util(g) for g in gpus) if v is not None]
        if not act or mean(act) >= th.queue_sm_active_max_ratio:
            continue
        if e.kv_usage_ratio is not None and e.kv_usage_ratio >= th.queue_kv_usage_max_ratio:
            continue
        past = history.engine_series(e.target, lambda x: x.waiting, th.rate_window_s)
        if past and e.waiting < past[0][1]:
            continue  # the queue drains
        yield Candidate(
            engine_subject(e),
            (
                Evidence("waiting requests", e.waiting, "count", f">= {th.queue_waiting_min:g}"),
                Evidence("waiting a minute ago", past[0][1] if past else None, "count"),
                Evidence(
                    "SM active (mean of its GPUs)",
                    mean(act),
                    "ratio",
                    f"< {_pct(th.queue_sm_active_max_ratio)}",
                ),
                Evidence(
                    "KV-cache usage", e.kv_usage_ratio, "ratio", f"< {_pct(th.queue_kv_usage_max_ratio)}"
                ),
            ),
            f"{e.name}: {e.waiting:.0f} requests wait while its GPUs are {_pct(mean(act))} active",
        )


def api_server_cpu_bound(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        if e.api_server_cpu_ratio is None or e.api_server_cpu_ratio < th.api_cpu_min_ratio:
            continue
        yield Candidate(
            engine_subject(e),
            (
                Evidence(
                    "API-server CPU (one core = 100 %)",
                    e.api_server_cpu_ratio,
                    "ratio",
                    f">= {_pct(th.api_cpu_min_ratio)}",
                ),
            ),
            f"{e.name}: the API-server process uses {_pct(e.api_server_cpu_ratio)} of one core",
        )


def admission_rejections(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        r = _engine_rate(history, e, lambda x: x.rejected_total, th.rate_window_s)
        if r is None or r < th.rejections_min_per_second:
            continue
        yield Candidate(
            engine_subject(e),
            (Evidence("rejected requests", r, "per_second", f">= {th.rejections_min_per_second:g}/s"),),
            f"{e.name} refuses {r:.1f} requests/s at admission",
        )


# ---- parallel ------------------------------------------------------------------------


def sm_imbalance(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        gpus = [g for g in _engine_gpus(frame, e) if g.sm_active_ratio is not None]
        if len(gpus) < 2:
            continue
        busiest = max(gpus, key=lambda g: g.sm_active_ratio or 0.0)
        idlest = min(gpus, key=lambda g: g.sm_active_ratio or 0.0)
        hi, lo = busiest.sm_active_ratio or 0.0, idlest.sm_active_ratio or 0.0
        if hi - lo < th.imbalance_spread_ratio or hi < th.imbalance_busiest_min_ratio:
            continue
        yield Candidate(
            engine_subject(e),
            (
                Evidence("SM-active spread", hi - lo, "ratio", f">= {_pct(th.imbalance_spread_ratio)}"),
                Evidence(f"busiest GPU {busiest.index}", hi, "ratio"),
                Evidence(f"least busy GPU {idlest.index}", lo, "ratio"),
                Evidence("GPUs in the group", len(gpus), "count"),
            ),
            f"{e.name}: GPU {busiest.index} at {_pct(hi)} SM active, GPU {idlest.index} at {_pct(lo)}",
        )


def _nvlink_rates(history: History, g: GpuFrame, window: float) -> tuple[float | None, float | None]:
    if g.nvlink_tx_bytes_per_second is not None or g.nvlink_rx_bytes_per_second is not None:
        return g.nvlink_tx_bytes_per_second, g.nvlink_rx_bytes_per_second
    tx = rate(history.gpu_series(g.index, lambda x: x.nvlink_tx_bytes_total, window))
    rx = rate(history.gpu_series(g.index, lambda x: x.nvlink_rx_bytes_total, window))
    return tx, rx


def nvlink_saturated(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        if not g.nvlink_links_up:
            continue
        capacity = g.nvlink_links_up * th.nvlink_link_bytes_per_second
        tx, rx = _nvlink_rates(history, g, th.rate_window_s)
        busiest = max((v for v in (tx, rx) if v is not None), default=None)
        if busiest is None or busiest / capacity < th.nvlink_saturation_ratio:
            continue
        yield Candidate(
            gpu_subject(g),
            (
                Evidence(
                    "NVLink use / capacity",
                    busiest / capacity,
                    "ratio",
                    f">= {_pct(th.nvlink_saturation_ratio)}",
                ),
                Evidence("NVLink transmit", tx, "bytes_per_second"),
                Evidence("NVLink receive", rx, "bytes_per_second"),
                Evidence(
                    f"capacity ({g.nvlink_links_up} links, per direction)", capacity, "bytes_per_second"
                ),
            ),
            f"GPU {g.index}'s NVLinks run at {_pct(busiest / capacity)} of capacity",
        )


def tp_over_pcie(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        gpus = _engine_gpus(frame, e)
        if len(gpus) < 2 or any(g.mig_enabled for g in gpus):
            continue
        if any(g.nvlink_links_up is None or g.nvlink_links_up > 0 for g in gpus):
            continue
        yield Candidate(
            engine_subject(e),
            (
                Evidence("GPUs in the group", len(gpus), "count"),
                Evidence("active NVLinks", 0, "count"),
                Evidence("GPU model", gpus[0].name or "unknown"),
            ),
            f"{e.name} splits its model over {len(gpus)} GPUs that talk over PCIe only",
        )


# ---- decoding ------------------------------------------------------------------------


def low_spec_acceptance(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        acc = e.spec_acceptance_ratio
        if acc is None or acc >= th.spec_accept_min_ratio or not e.running:
            continue
        yield Candidate(
            engine_subject(e),
            (Evidence("draft tokens accepted", acc, "ratio", f"< {_pct(th.spec_accept_min_ratio)}"),),
            f"{e.name} accepts only {_pct(acc)} of its speculative draft tokens",
        )


def itl_jitter(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        p50, p99 = e.itl_p50_seconds, e.itl_p99_seconds
        if not p50 or p99 is None or not e.running:
            continue
        if p99 / p50 < th.itl_jitter_factor:
            continue
        yield Candidate(
            engine_subject(e),
            (
                Evidence("inter-token latency p99 / p50", p99 / p50, "", f">= {th.itl_jitter_factor:g}"),
                Evidence("p50", p50, "seconds"),
                Evidence("p99", p99, "seconds"),
            ),
            f"{e.name}: token stream stutters, p99 inter-token latency {p99 / p50:.1f}x the median",
        )


# ---- capacity ------------------------------------------------------------------------


def sm_saturation(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        if g.sm_active_ratio is None or g.sm_active_ratio <= th.sm_saturation_ratio:
            continue
        yield Candidate(
            gpu_subject(g),
            (Evidence("SM active", g.sm_active_ratio, "ratio", f"> {_pct(th.sm_saturation_ratio)}"),),
            f"GPU {g.index} has no SM time left ({_pct(g.sm_active_ratio)} active)",
        )


def knee_point(samples: list[tuple[float, float, float]], th: Th) -> tuple[float, float, float] | None:
    """(knee rate, tokens/s at the knee, p99 latency at low load) from (rate, tps, p99) samples.

    The samples are binned by offered rate into equal-width bins; the knee is the first
    bin after which tokens/s per extra request/s drops below `knee_slope_drop_ratio` of
    the low-load slope (the second difference turning sharply negative). None when the
    load never moved enough or throughput never stopped rising.
    """
    pts = [p for p in samples if p[0] > 0]
    if len(pts) < th.knee_min_samples:
        return None
    lo, hi = min(p[0] for p in pts), max(p[0] for p in pts)
    if hi < th.knee_min_rate_span * lo:
        return None
    width = (hi - lo) / th.knee_bins
    bins: list[list[tuple[float, float, float]]] = [[] for _ in range(th.knee_bins)]
    for p in pts:
        bins[min(th.knee_bins - 1, int((p[0] - lo) / width))].append(p)
    means = [tuple(mean(col) for col in zip(*b, strict=True)) for b in bins if len(b) >= 2]
    if len(means) < 3:
        return None
    r0, t0, l0 = means[0]
    r1, t1, _ = means[1]
    if r1 <= r0 or t1 <= t0:
        return None
    base = (t1 - t0) / (r1 - r0)
    for i in range(1, len(means) - 1):
        ri, ti, _ = means[i]
        rj, tj, _ = means[i + 1]
        if rj > ri and (tj - ti) / (rj - ri) < th.knee_slope_drop_ratio * base:
            return ri, ti, l0
    return None


KNEE_MAX_SAMPLES = 300


def throughput_knee(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        now_rate, now_lat = e.request_rate_per_second, _latency(e)
        if not e.up or now_rate is None or now_lat is None:
            continue
        samples = []
        frames = list(history)
        stride = max(1, len(frames) // KNEE_MAX_SAMPLES)  # the curve needs hundreds, not thousands
        for f in frames[::-stride]:
            x = f.engine(e.target)
            if x is None:
                continue
            lat = _latency(x)
            if x.request_rate_per_second is None or x.generation_tokens_per_second is None or lat is None:
                continue
            samples.append((x.request_rate_per_second, x.generation_tokens_per_second, lat))
        knee = knee_point(samples, th)
        if knee is None:
            continue
        knee_rate, knee_tps, base_lat = knee
        if now_rate < knee_rate or now_lat < th.knee_latency_jump_factor * base_lat:
            continue
        yield Candidate(
            engine_subject(e),
            (
                Evidence("offered load now", now_rate, "per_second", f">= knee {knee_rate:.2f}/s"),
                Evidence("knee (tokens/s stops rising)", knee_rate, "per_second"),
                Evidence("generated tokens/s at the knee", knee_tps, "per_second"),
                Evidence("generated tokens/s now", e.generation_tokens_per_second, "per_second"),
                Evidence("p99 latency at low load", base_lat, "seconds"),
                Evidence(
                    "p99 latency now", now_lat, "seconds", f">= {th.knee_latency_jump_factor:g}x low load"
                ),
            ),
            f"{e.name} is past its knee: {now_rate:.1f} req/s offered, throughput flat since "
            f"{knee_rate:.1f} req/s, p99 latency {now_lat / base_lat:.1f}x",
        )


def _latency(e: EngineFrame) -> float | None:
    return e.ttft_p99_seconds if e.ttft_p99_seconds is not None else e.itl_p99_seconds


# ---- the table -----------------------------------------------------------------------


def _rule(
    id: str,
    severity: str,
    scope: Scope,
    check: Callable[[Frame, History, Th], Iterable[Candidate]],
    hold: Callable[[Th], float],
    title: str,
    condition: str,
    advice: str,
    clear: Callable[[Th], float] = lambda t: t.clear_s,
) -> Rule:
    return Rule(id, severity, scope, title, condition, advice, check, hold, clear)


RULES: tuple[Rule, ...] = (
    _rule(
        "hardware/gpu_lost",
        "critical",
        "gpu",
        gpu_lost,
        lambda t: t.gpu_lost_hold_s,
        "GPU stopped answering",
        "NVML calls for the GPU fail (GpuIsLost, timeouts) for gpu_lost_hold_s",
        "Drain the node, collect `nvidia-bug-report.sh`, reset or replace the GPU; engines on it are down.",
    ),
    _rule(
        "hardware/xid_fatal",
        "critical",
        "gpu",
        xid_fatal,
        lambda t: 0.0,
        "Fatal XID error",
        "an XID listed in xid_fatal seen in the last xid_window_s",
        "Drain the GPU and reset it (`nvidia-smi -r`); a repeat means an RMA.",
        clear=lambda t: 0.0,
    ),
    _rule(
        "hardware/ecc_uncorrectable",
        "critical",
        "gpu",
        ecc_uncorrectable,
        lambda t: 0.0,
        "Uncorrectable ECC errors",
        "the volatile uncorrected ECC counter grew in the last ecc_window_s, or a row remap failed",
        "Drain the GPU; reset it to remap the rows; replace it when remapping failed.",
        clear=lambda t: 0.0,
    ),
    _rule(
        "hardware/thermal_throttle",
        "warning",
        "gpu",
        thermal_throttle,
        lambda t: t.throttle_hold_s,
        "Clocks throttled by heat",
        "a thermal clock-event reason (sw_thermal, hw_thermal, hw_slowdown) active for throttle_hold_s",
        "Check fans, airflow and inlet temperature of the chassis; compare with the GPU's neighbours.",
    ),
    _rule(
        "hardware/power_throttle",
        "warning",
        "gpu",
        power_throttle,
        lambda t: t.throttle_hold_s,
        "Clocks held down by the power limit",
        "a power clock-event reason (sw_power_cap, hw_power_brake) active with SM clock < "
        "power_throttle_clock_max_ratio of max, for throttle_hold_s",
        "Check the enforced power limit (`nvidia-smi -q -d POWER`) and the PSU/rack power budget.",
    ),
    _rule(
        "hardware/busy_idle_sms",
        "warning",
        "gpu",
        busy_idle_sms,
        lambda t: t.busy_idle_hold_s,
        "GPU busy but SMs idle",
        "NVML utilization >= busy_util_min_ratio while GPM SM active < busy_sm_active_max_ratio",
        "Batch more work per kernel: raise max_num_seqs / batch size, enable "
        "CUDA graphs, look for serial small kernels.",
    ),
    _rule(
        "hardware/dram_bandwidth_bound",
        "info",
        "gpu",
        dram_bandwidth_bound,
        lambda t: t.dram_bound_hold_s,
        "Memory-bandwidth bound",
        "GPM DRAM bandwidth / peak >= dram_bound_ratio",
        "Decode is bandwidth bound: quantize weights or KV cache (FP8), raise batch size per weight read, "
        "or add tensor-parallel GPUs.",
    ),
    _rule(
        "hardware/pcie_replays",
        "warning",
        "gpu",
        pcie_replays,
        lambda t: t.pcie_replay_hold_s,
        "PCIe link replaying packets",
        "PCIe replay counter rising faster than pcie_replays_per_minute over pcie_replay_window_s",
        "Reseat the GPU or riser, check the link speed/width (`nvidia-smi -q -d PCIE`), update firmware.",
    ),
    _rule(
        "hardware/numa_mismatch",
        "warning",
        "gpu_engine",
        numa_mismatch,
        lambda t: t.numa_hold_s,
        "GPU on a different NUMA node from the engine's CPUs",
        "the GPU's NUMA node is not among the NUMA nodes of the CPUs the engine may run on",
        "Pin the engine to the GPU's NUMA node (numactl / CPU manager static policy / topology manager).",
    ),
    _rule(
        "kernel/low_tensor_activity",
        "warning",
        "gpu",
        low_tensor_activity,
        lambda t: t.tensor_hold_s,
        "SMs busy without tensor cores",
        "SM active >= tensor_sm_active_min_ratio while tensor-core active < tensor_active_max_ratio",
        "Check the dtype (bf16/fp16/fp8, not fp32) and that attention and GEMM "
        "kernels have a tensor-core path.",
    ),
    _rule(
        "kernel/low_mfu_mbu",
        "info",
        "engine",
        low_mfu_mbu,
        lambda t: t.mfu_hold_s,
        "Busy GPUs, little achieved compute or bandwidth",
        "GPUs utilization >= mfu_busy_util_min_ratio with MFU < mfu_min_ratio and MBU < mbu_min_ratio "
        "(engine FLOP and byte estimates over peak)",
        "Profile the step: launch overhead, host syncs, small batches; enable "
        "CUDA graphs and larger batches.",
    ),
    _rule(
        "memory/oom_risk",
        "critical",
        "gpu_engine",
        oom_risk,
        lambda t: t.oom_hold_s,
        "Out-of-memory risk",
        "OOM-risk score >= oom_finding_ratio (see the score's reasons)",
        "Find the growing process (llmgpu_gpu_process_memory_used_bytes); lower gpu_memory_utilization "
        "or restart the leaking process before it crashes.",
        clear=lambda t: t.oom_clear_s,
    ),
    _rule(
        "memory/kv_cache_saturated",
        "warning",
        "engine",
        kv_cache_saturated,
        lambda t: t.kv_hold_s,
        "KV cache full, requests preempted",
        "KV-cache usage >= kv_usage_min_ratio and preemptions >= kv_preemptions_min_per_second",
        "Lower max_num_seqs or max_model_len, use an FP8 KV cache, raise "
        "gpu_memory_utilization, or add replicas.",
    ),
    _rule(
        "memory/xid_memory_fault",
        "critical",
        "gpu",
        xid_memory_fault,
        lambda t: 0.0,
        "Memory fault in an application (XID 31/43)",
        "an XID listed in xid_memory seen in the last xid_window_s",
        "Read the engine's log around the XID: an OOM or an illegal address "
        "killed the CUDA context; restart it.",
        clear=lambda t: 0.0,
    ),
    _rule(
        "memory/allocator_fragmentation",
        "warning",
        "gpu",
        allocator_fragmentation,
        lambda t: t.oom_hold_s,
        "Allocator memory fragmented",
        "largest free block < oom_typical_request_bytes <= free bytes inside reserved segments, with "
        "fragmentation >= oom_fragmentation_min_ratio (allocator probe)",
        "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; avoid varying large allocations.",
    ),
    _rule(
        "scheduling/queue_with_idle_gpu",
        "warning",
        "engine",
        queue_with_idle_gpu,
        lambda t: t.queue_hold_s,
        "Requests queue while GPUs have room",
        "waiting >= queue_waiting_min and not falling over a minute, SM active < queue_sm_active_max_ratio, "
        "KV usage < queue_kv_usage_max_ratio",
        "Raise max_num_seqs / max_num_batched_tokens; check the API server and the scheduler for stalls.",
    ),
    _rule(
        "scheduling/api_server_cpu_bound",
        "warning",
        "engine",
        api_server_cpu_bound,
        lambda t: t.api_cpu_hold_s,
        "API server at one full core",
        "API-server process CPU >= api_cpu_min_ratio of one core",
        "Run more API-server processes (vLLM --api-server-count), move tokenization off the hot path.",
    ),
    _rule(
        "scheduling/admission_rejections",
        "warning",
        "engine",
        admission_rejections,
        lambda t: t.rejections_hold_s,
        "Requests refused at admission",
        "rejected requests >= rejections_min_per_second over rate_window_s",
        "Add capacity or raise the admission limit; make clients back off and retry.",
    ),
    _rule(
        "parallel/sm_imbalance",
        "warning",
        "engine",
        sm_imbalance,
        lambda t: t.imbalance_hold_s,
        "Straggler in a parallel group",
        "SM-active spread across the engine's GPUs >= imbalance_spread_ratio with the busiest >= "
        "imbalance_busiest_min_ratio",
        "Look at the busiest GPU: clocks, thermals, its NVLinks; with expert parallelism, rebalance experts.",
    ),
    _rule(
        "parallel/nvlink_saturated",
        "warning",
        "gpu",
        nvlink_saturated,
        lambda t: t.nvlink_hold_s,
        "NVLink near capacity",
        "NVLink transmit or receive >= nvlink_saturation_ratio of active links "
        "x nvlink_link_bytes_per_second",
        "Reduce collective traffic: fewer tensor-parallel ranks with more "
        "replicas, or overlap communication.",
    ),
    _rule(
        "parallel/tp_over_pcie",
        "warning",
        "engine",
        tp_over_pcie,
        lambda t: t.tp_pcie_hold_s,
        "Tensor parallel over PCIe only",
        "an engine spans two or more GPUs and none of them has an active NVLink",
        "Prefer one GPU per replica (quantize to fit), or pipeline parallel "
        "across PCIe; keep TP inside NVLink.",
    ),
    _rule(
        "decoding/low_spec_acceptance",
        "info",
        "engine",
        low_spec_acceptance,
        lambda t: t.spec_hold_s,
        "Speculative decoding rarely accepted",
        "accepted / proposed draft tokens < spec_accept_min_ratio with requests running",
        "Use a draft model closer to the target, fewer speculative tokens, or switch speculation off.",
    ),
    _rule(
        "decoding/itl_jitter",
        "warning",
        "engine",
        itl_jitter,
        lambda t: t.itl_hold_s,
        "Token stream stutters",
        "inter-token latency p99 / p50 >= itl_jitter_factor with requests running",
        "Enable chunked prefill (smaller max_num_batched_tokens) and check for preemptions and host stalls.",
    ),
    _rule(
        "capacity/sm_saturation",
        "warning",
        "gpu",
        sm_saturation,
        lambda t: t.sm_saturation_hold_s,
        "GPU saturated",
        "SM active > sm_saturation_ratio for sm_saturation_hold_s",
        "The node is full: add replicas or route load elsewhere; latency will grow with any extra load.",
    ),
    _rule(
        "capacity/throughput_knee",
        "warning",
        "engine",
        throughput_knee,
        lambda t: t.knee_hold_s,
        "Past the throughput knee",
        "offered load at or past the rate where tokens/s stopped rising (history) while p99 TTFT >= "
        "knee_latency_jump_factor x its low-load value",
        "Cap the load per replica at the knee rate (autoscaling target) and add replicas beyond it.",
    ),
)

RULES_BY_ID = {r.id: r for r in RULES}
