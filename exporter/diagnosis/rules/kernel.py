"""Kernel: compute wasted on the wrong pipes or on launches."""

from __future__ import annotations

from collections.abc import Iterator
from statistics import mean

from exporter.diagnosis.frame import Frame
from exporter.diagnosis.history import History
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


@rule(
    "kernel/low_tensor_activity",
    severity="warning",
    scope="gpu",
    hold="tensor_hold_s",
    title="SMs busy without tensor cores",
    condition="SM active >= tensor_sm_active_min_ratio while tensor-core active < tensor_active_max_ratio",
    advice=(
        "Check the dtype (bf16/fp16/fp8, not fp32) and that attention and GEMM kernels have a "
        "tensor-core path."
    ),
)
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


@rule(
    "kernel/low_mfu_mbu",
    severity="info",
    scope="engine",
    hold="mfu_hold_s",
    window="rate_window_s",
    title="Busy GPUs, little achieved compute or bandwidth",
    condition=(
        "GPUs utilization >= mfu_busy_util_min_ratio with MFU < mfu_min_ratio and MBU < mbu_min_ratio "
        "(engine FLOP and byte estimates over peak)"
    ),
    advice=(
        "Profile the step: launch overhead, host syncs, small batches; enable CUDA graphs and larger batches."
    ),
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
        flops = history.engine_rate(e.target, lambda x: x.estimated_flops_per_gpu_total, th.rate_window_s)
        read = history.engine_rate(e.target, lambda x: x.estimated_read_bytes_per_gpu_total, th.rate_window_s)
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
