"""Parallel: stragglers in a tensor-parallel group, NVLink capacity, TP over PCIe."""

from __future__ import annotations

from collections.abc import Iterator

from exporter.diagnosis.frame import Frame, GpuFrame
from exporter.diagnosis.history import History, rate
from exporter.diagnosis.model import Candidate, Evidence
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
    tx = rate(history.gpu_series(g.index, lambda x: x.nvlink_tx_bytes_total, window))
    rx = rate(history.gpu_series(g.index, lambda x: x.nvlink_rx_bytes_total, window))
    return tx, rx


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
        "Look at the busiest GPU: clocks, thermals, its NVLinks; with expert parallelism, rebalance experts."
    ),
)
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


@rule(
    "parallel/nvlink_saturated",
    severity="warning",
    scope="gpu",
    hold="nvlink_hold_s",
    title="NVLink near capacity",
    condition=(
        "NVLink transmit or receive >= nvlink_saturation_ratio of active links x nvlink_link_bytes_per_second"
    ),
    advice=(
        "Reduce collective traffic: fewer tensor-parallel ranks with more replicas, or overlap communication."
    ),
)
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


@rule(
    "parallel/tp_over_pcie",
    severity="warning",
    scope="engine",
    hold="tp_pcie_hold_s",
    title="Tensor parallel over PCIe only",
    condition="an engine spans two or more GPUs and none of them has an active NVLink",
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
