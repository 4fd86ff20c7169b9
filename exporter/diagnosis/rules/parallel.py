"""Parallel: stragglers in a tensor-parallel group, NVLink capacity, TP over PCIe, KV transfer
between prefill and decode."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from statistics import median

from exporter.diagnosis.frame import Frame, GpuFrame
from exporter.diagnosis.history import History
from exporter.diagnosis.model import Candidate, Evidence, Unit
from exporter.diagnosis.rules.base import (
    Th,
    _engine_gpus,
    _live,
    _pct,
    engine_subject,
    gpu_subject,
    rule,
)


def _nvlink_rates(history: History, g: GpuFrame, window: float) -> tuple[float | None, float | None]:
    if g.nvlink_tx_bytes_per_second is not None or g.nvlink_rx_bytes_per_second is not None:
        return g.nvlink_tx_bytes_per_second, g.nvlink_rx_bytes_per_second
    tx = history.gpu_rate(g.index, lambda x: x.nvlink_tx_bytes_total, window)
    rx = history.gpu_rate(g.index, lambda x: x.nvlink_rx_bytes_total, window)
    return tx, rx


def _links(g: GpuFrame) -> int | None:
    """Links that carry traffic or wake for it: active ones and sleeping ones, each once."""
    if g.nvlink_links_up is None:
        return None
    return g.nvlink_links_up + (g.nvlink_links_sleeping or 0)


def _slower_clock(g: GpuFrame, group: list[GpuFrame]) -> bool:
    """The GPU computes slower than its peers: a throttle reason, or a clock 5 % lower."""
    if g.throttle_reasons and any(r not in ("gpu_idle", "applications_clocks") for r in g.throttle_reasons):
        return True
    clocks = [x.sm_clock_ratio for x in group if x is not g and x.sm_clock_ratio is not None]
    return g.sm_clock_ratio is not None and bool(clocks) and g.sm_clock_ratio < 0.95 * median(clocks)


SAME_ACTIVITY = 0.02  # SM-active ratios this close read as the same (sampling noise)


def _straggler_evidence(g: GpuFrame, group: list[GpuFrame], med: float) -> list[Evidence]:
    others = [x for x in group if x is not g]
    ev = [
        Evidence(f"GPU {g.index} SM active", g.sm_active_ratio, "ratio"),
        Evidence("group median SM active", med, "ratio"),
    ]
    compared: tuple[tuple[str, Unit, Callable[[GpuFrame], float | None]], ...] = (
        ("SM clock / max", "ratio", lambda x: x.sm_clock_ratio),
        ("temperature", "celsius", lambda x: x.temperature_celsius),
        ("power", "watts", lambda x: x.power_watts),
    )
    for name, unit, get in compared:
        mine = get(g)
        theirs = [v for v in (get(x) for x in others) if v is not None]
        if mine is not None and theirs:
            ev.append(Evidence(f"GPU {g.index} {name}", mine, unit))
            ev.append(Evidence(f"{name}, median of the others", median(theirs), unit))
    if g.throttle_reasons:
        ev.append(Evidence(f"GPU {g.index} clock-event reasons", ", ".join(g.throttle_reasons)))
    if g.nvlink_links_up is not None:
        ev.append(Evidence(f"GPU {g.index} NVLinks up", g.nvlink_links_up, "count"))
    return ev


@rule(
    "parallel/sm_imbalance",
    severity="warning",
    scope="engine",
    hold="imbalance_hold_s",
    title="Straggler in a parallel group",
    condition=(
        "SM-active spread across the engine's GPUs >= imbalance_spread_ratio with the busiest >= "
        "imbalance_busiest_min_ratio"
    ),
    advice=(
        "Look at the GPU the group waits for (named in the finding): its clocks, throttle reasons, "
        "NVLinks and the CPU feeding it; with expert parallelism, rebalance experts."
    ),
)
def sm_imbalance(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    """Name the rank the others wait for.

    Tensor-parallel ranks do the same work, so the GPU farthest from the group's median is
    the odd one. One below the median is late to each collective (host stalls, CPU or
    NUMA contention, a slow link) while the others spin in NCCL kernels that count as SM
    activity: it is the straggler. One above the median with a lower clock or a throttle
    reason computes slower than its peers: it is the straggler too. Ranks above the median
    at full clock carry more work (hot experts under expert parallelism).
    """
    for e in frame.engines:
        gpus = [g for g in _engine_gpus(frame, e) if g.sm_active_ratio is not None]
        if len(gpus) < 2:
            continue
        hi = max(g.sm_active_ratio or 0.0 for g in gpus)
        lo = min(g.sm_active_ratio or 0.0 for g in gpus)
        # GPUs within SAME_ACTIVITY of the busiest (idlest) are as busy (idle) as it: the
        # first by index is named, so the name does not flip with a sample's noise.
        busiest = next(g for g in gpus if hi - (g.sm_active_ratio or 0.0) <= SAME_ACTIVITY)
        idlest = next(g for g in gpus if (g.sm_active_ratio or 0.0) - lo <= SAME_ACTIVITY)
        if hi - lo < th.imbalance_spread_ratio or hi < th.imbalance_busiest_min_ratio:
            continue
        med = median(g.sm_active_ratio or 0.0 for g in gpus)
        slow = [g for g in gpus if _slower_clock(g, gpus)]
        if slow:
            odd = min(slow, key=lambda g: g.sm_clock_ratio if g.sm_clock_ratio is not None else 1.0)
            why = "computes at a lower clock than its peers; the group waits for it"
            advice = (
                f"GPU {odd.index} is the straggler: check its cooling and power limit "
                "(`nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE`); the group runs at its pace."
            )
        elif med - lo >= hi - med:
            odd = idlest
            why = "is the least busy: the others spin in collectives waiting for it"
            advice = (
                f"GPU {odd.index} is the straggler the group waits for: check the CPU cores and NUMA "
                "node of its worker process, its PCIe/NVLink links and its clocks."
            )
        else:
            odd = busiest
            hot = sorted(
                g.index for g in gpus if (g.sm_active_ratio or 0.0) - med >= th.imbalance_spread_ratio
            )
            names = ", ".join(f"GPU {i}" for i in hot) or f"GPU {odd.index}"
            why = "carries more work than the group at full clock"
            advice = (
                f"{names} carry more work than the rest of the group: with expert parallelism, "
                "rebalance the experts (EPLB) or replicate the hot ones."
            )
        yield Candidate(
            engine_subject(e),
            (
                Evidence("SM-active spread", hi - lo, "ratio", f">= {_pct(th.imbalance_spread_ratio)}"),
                Evidence("straggler", f"GPU {odd.index}"),
                *_straggler_evidence(odd, gpus, med),
                Evidence("GPUs in the group", len(gpus), "count"),
            ),
            f"{e.name}: GPU {odd.index} {why} ({_pct(odd.sm_active_ratio or 0.0)} SM active, "
            f"group median {_pct(med)})",
            advice,
        )


@rule(
    "parallel/nvlink_saturated",
    severity="warning",
    scope="gpu",
    hold="nvlink_hold_s",
    window="rate_window_s",
    title="NVLink near capacity",
    condition=(
        "NVLink transmit or receive >= nvlink_saturation_ratio of the links up or asleep "
        "x nvlink_link_bytes_per_second"
    ),
    advice=(
        "Reduce collective traffic: fewer tensor-parallel ranks with more replicas, or overlap communication."
    ),
)
def nvlink_saturated(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        links = _links(g)
        if not links:
            continue
        capacity = links * th.nvlink_link_bytes_per_second
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
                Evidence(f"capacity ({links} links, per direction)", capacity, "bytes_per_second"),
            ),
            f"GPU {g.index}'s NVLinks run at {_pct(busiest / capacity)} of capacity",
        )


@rule(
    "parallel/tp_over_pcie",
    severity="warning",
    scope="engine",
    hold="tp_pcie_hold_s",
    title="Tensor parallel over PCIe only",
    condition="an engine spans two or more GPUs and none of them has an NVLink active or asleep",
    advice=(
        "Prefer one GPU per replica (quantize to fit), or pipeline parallel across PCIe; keep TP "
        "inside NVLink."
    ),
)
def tp_over_pcie(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        gpus = _engine_gpus(frame, e)
        if len(gpus) < 2 or any(g.mig_enabled for g in gpus):
            continue
        if any((links := _links(g)) is None or links > 0 for g in gpus):
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


@rule(
    "parallel/kv_transfer_slow",
    severity="warning",
    scope="engine",
    hold="kv_transfer_hold_s",
    window="rate_window_s",  # a TTFT quantile and a transfer latency over the last minute
    title="KV transfer dominates time to first token",
    condition=(
        "KV transfer latency >= kv_transfer_ttft_share_min x the model's TTFT p50 (the largest of its "
        "engines'), TTFT p50 >= kv_transfer_ttft_min_s"
    ),
    advice=(
        "Check the KV connector's transport: RDMA devices visible to both pods (NIXL/UCX backends, "
        "UCX_TLS, Mooncake's protocol), the NIC on the GPU's PCIe switch and NUMA node, the network "
        "between prefill and decode; a TCP fallback moves KV at a few GB/s."
    ),
)
def kv_transfer_slow(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        latency = e.kv_transfer_latency_seconds
        if not e.up or latency is None:
            continue
        # TTFT is observed where the first token leaves: the decode side in SGLang, which
        # reports the transfer on the prefill side; the largest median of the model's engines
        ttfts = [x.ttft_p50_seconds for x in frame.engines if x.up and x.model == e.model]
        ttft = max((t for t in ttfts if t is not None), default=None)
        if ttft is None or ttft < th.kv_transfer_ttft_min_s or latency < th.kv_transfer_ttft_share_min * ttft:
            continue
        failures = history.engine_rate(e.target, lambda x: x.kv_transfer_failures_total, th.rate_window_s)
        ev = [
            Evidence("KV transfer per request", latency, "seconds"),
            Evidence("time to first token p50", ttft, "seconds", f">= {th.kv_transfer_ttft_min_s:g} s"),
            Evidence(
                "transfer share of TTFT", latency / ttft, "ratio", f">= {_pct(th.kv_transfer_ttft_share_min)}"
            ),
        ]
        if failures is not None:
            ev.append(Evidence("failed transfers", failures, "per_second"))
        yield Candidate(
            engine_subject(e),
            tuple(ev),
            f"{e.name}: moving the KV cache takes {latency * 1e3:.0f} ms of a {ttft * 1e3:.0f} ms "
            f"time to first token ({_pct(latency / ttft)})",
        )
