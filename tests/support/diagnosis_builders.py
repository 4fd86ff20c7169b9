"""Builders of frames for the diagnosis tests: a quiet node unless a test changes a field."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from exporter.diagnosis.diagnoser import Diagnoser
from exporter.diagnosis.frame import EngineFrame, Frame, GpuFrame
from exporter.diagnosis.history import History
from exporter.diagnosis.model import Candidate, Rule
from exporter.diagnosis.thresholds import DEFAULT, Thresholds

GIB = 1024**3
T0 = 1_700_000_000.0  # an epoch time, as taken_at is in production


def gpu(index: int = 0, **kw: Any) -> GpuFrame:
    base: dict[str, Any] = dict(
        index=index,
        uuid=f"GPU-{index:04d}",
        up=True,
        name="NVIDIA H100 80GB HBM3",
        numa_node=0,
        memory_total_bytes=80.0 * GIB,
        memory_used_bytes=72.0 * GIB,
        util_ratio=0.7,
        sm_active_ratio=0.5,
        tensor_active_ratio=0.4,
        dram_active_ratio=0.4,
        dram_peak_bytes_per_second=3350e9,
        sm_clock_ratio=0.95,
        throttle_reasons=(),
        power_watts=400.0,
        power_limit_watts=700.0,
        temperature_celsius=60.0,
        pcie_replays_total=0.0,
        nvlink_links_up=18,
        nvlink_tx_bytes_per_second=50e9,
        nvlink_rx_bytes_per_second=50e9,
        ecc_uncorrected_total=0.0,
        process_pids=(1000 + index,),
        process_count=1,
    )
    base.update(kw)
    return GpuFrame(**base)


def engine(
    target: str = "http://10.0.0.1:8000/metrics", gpus: tuple[int, ...] = (0,), **kw: Any
) -> EngineFrame:
    base: dict[str, Any] = dict(
        target=target,
        name="vllm Llama-3.1-8B",
        model="meta-llama/Llama-3.1-8B-Instruct",
        kind="vllm",
        gpus=gpus,
        gpu_uuids=tuple(f"GPU-{i:04d}" for i in gpus),
        pids=frozenset(1000 + i for i in gpus),
        running=20.0,
        waiting=0.0,
        kv_usage_ratio=0.4,
        preemptions_total=0.0,
        preemptions_per_second=0.0,
        generation_tokens_per_second=1000.0,
        prompt_tokens_per_second=3000.0,
        request_rate_per_second=4.0,
        rejected_total=0.0,
        ttft_p50_seconds=0.08,
        ttft_p99_seconds=0.2,
        itl_p50_seconds=0.02,
        itl_p99_seconds=0.04,
        gpu_memory_utilization=0.9,
        api_server_cpu_ratio=0.3,
    )
    base.update(kw)
    return EngineFrame(**base)


def frame(t: float, gpus: tuple[GpuFrame, ...] = (), engines: tuple[EngineFrame, ...] = ()) -> Frame:
    return Frame(T0 + t, gpus or (gpu(0),), engines)


def run_rule(rule: Rule, frames: list[Frame], th: Thresholds = DEFAULT) -> list[Candidate]:
    """Feed frames into a history one by one; the rule's candidates on the last one."""
    history = History(900.0)
    out: list[Candidate] = []
    for f in frames:
        history.add(f)
        out = list(rule.check(f, history, th))
    return out


def feed(d: Diagnoser, frames: list[Frame]) -> set[str]:
    """Step a diagnoser through frames; the finding ids active on the last one."""
    active: set[str] = set()
    for f in frames:
        _, _, diagnosis = d.step(f)
        active = {x.id for x in diagnosis.findings}
    return active


def steady(n: int, every: float = 5.0, **changes: Any) -> list[Frame]:
    """n frames `every` seconds apart of one GPU with fields changed."""
    return [frame(i * every, (replace(gpu(0), **changes),)) for i in range(n)]
