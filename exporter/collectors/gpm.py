"""GPM profiling (Hopper and later): SM, tensor, DRAM and pipe activity, PCIe and NVLink rates.

Each GPU keeps two sample buffers and alternates them: every run takes one new sample
and compares it with the previous run's, so nothing ever sleeps between two samples.
NVML compares only samples at least 100 ms apart: a run sooner than that after the last
sample keeps the previous sample and repeats the last result. Buffers are freed when a
GPU stops answering, when the collector stops, and before the NVML session is rebuilt
after a driver reload (new buffers are then allocated on the new session).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

from exporter.collectors.base import Context, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import Profiling
from exporter.nvml import NvmlError
from exporter.nvml import const as N

MIB = 1024 * 1024
MIN_SAMPLE_GAP_S = 0.1  # NVML's shortest span between two GPM samples it compares
# metric id -> (Profiling field, scale to base units)
METRICS: dict[int, tuple[str, float]] = {
    N.NVML_GPM_METRIC_SM_UTIL: ("sm_active_ratio", 0.01),
    N.NVML_GPM_METRIC_SM_OCCUPANCY: ("sm_occupancy_ratio", 0.01),
    N.NVML_GPM_METRIC_ANY_TENSOR_UTIL: ("tensor_active_ratio", 0.01),
    N.NVML_GPM_METRIC_DRAM_BW_UTIL: ("dram_active_ratio", 0.01),
    N.NVML_GPM_METRIC_FP16_UTIL: ("fp16_active_ratio", 0.01),
    N.NVML_GPM_METRIC_FP32_UTIL: ("fp32_active_ratio", 0.01),
    N.NVML_GPM_METRIC_FP64_UTIL: ("fp64_active_ratio", 0.01),
    N.NVML_GPM_METRIC_PCIE_TX_PER_SEC: ("pcie_tx_bytes_per_second", MIB),
    N.NVML_GPM_METRIC_PCIE_RX_PER_SEC: ("pcie_rx_bytes_per_second", MIB),
    N.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: ("nvlink_tx_bytes_per_second", MIB),
    N.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: ("nvlink_rx_bytes_per_second", MIB),
}


@dataclass
class _GpuState:
    supported: bool
    samples: list[Any] = field(default_factory=list)
    taken_at: float | None = None  # when the newest sample was taken (collector clock)
    metric_ids: list[int] | None = None  # None until probed
    last: Profiling | None = None


class GpmCollector(GpuCollector):
    name = "gpm"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.clock = ctx.clock
        self._state: dict[int, _GpuState] = {}
        self.nvml.before_restart(self.stop)  # free the buffers while their session exists

    def _gpu(self, index: int, h: Any) -> _GpuState | None:
        state = self._state.get(index)
        if state is None:
            support = self.query(N.nvmlGpmQueryDeviceSupport, h)
            state = _GpuState(supported=bool(support is not None and support.isSupportedDevice))
            if state.supported:
                for _ in range(2):
                    sample = self.query(N.nvmlGpmSampleAlloc)
                    if sample is None:  # this GPU only: try again next run
                        self._free(state)
                        return None
                    state.samples.append(sample)
            self._state[index] = state
        return state

    def read(self, index: int, h: Any) -> Profiling | None:
        state = self._gpu(index, h)
        if state is None or not state.supported:
            return None
        now = self.clock()
        if state.taken_at is not None and now - state.taken_at < MIN_SAMPLE_GAP_S:
            return state.last  # too soon for NVML to compare: keep the previous sample
        current, previous = state.samples[1], state.samples[0]
        if self.query(N.nvmlGpmSampleGet, h, current) is None:
            return None
        state.samples.reverse()  # this sample is the next run's previous one
        first = state.taken_at is None
        state.taken_at = now
        if first:
            return None
        ids = state.metric_ids if state.metric_ids is not None else list(METRICS)
        got = self._metrics(previous, current, ids)
        if got is None:
            return None
        if state.metric_ids is None:  # probe once: keep the ids this GPU answers
            state.metric_ids = [m for m in ids if m in got]
        # A NaN is a blank, as DCGM reads it (DcgmGpmManager.cpp): never a value, so it
        # neither reaches /metrics nor replaces a dcgm-exporter's in the field-by-field merge.
        values = {METRICS[m][0]: v * METRICS[m][1] for m, v in got.items() if math.isfinite(v)}
        state.last = Profiling(**values)
        return state.last

    def _metrics(self, first: Any, second: Any, ids: list[int]) -> dict[int, float] | None:
        return metrics_between(self, first, second, ids)

    def _free(self, state: _GpuState) -> None:
        for sample in state.samples:
            with contextlib.suppress(NvmlError):
                self.nvml.query(N.nvmlGpmSampleFree, sample)
        state.samples = []

    def forget(self, index: int) -> None:
        state = self._state.pop(index, None)
        if state is not None:
            self._free(state)

    def stop(self) -> None:
        for index in list(self._state):
            self.forget(index)


def metrics_between(c: GpuCollector, first: Any, second: Any, ids: list[int]) -> dict[int, float] | None:
    """The metrics `ids` between two samples of one GPU or GPU instance; a failure is
    counted on the collector `c`, never taken for the GPU's."""
    req = N.c_nvmlGpmMetricsGet_t()
    req.version = N.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = len(ids)
    req.sample1 = first
    req.sample2 = second
    for i, metric_id in enumerate(ids):
        req.metrics[i].metricId = metric_id
    c._calls += 1
    try:  # takes no device handle: whatever it answers is about these samples, not the GPU
        if c.nvml.query(N.nvmlGpmMetricsGet, req) is None:
            return {}
    except NvmlError as err:
        c.failed(err)
        return None
    return {m.metricId: m.value for m in req.metrics[: len(ids)] if m.nvmlReturn == N.NVML_SUCCESS}


@register("gpm", "GPM profiling: SM/tensor/DRAM activity, pipes, PCIe and NVLink rates (Hopper+)", nvml=True)
def _factory(ctx: Context) -> GpmCollector:
    return GpmCollector(ctx)
