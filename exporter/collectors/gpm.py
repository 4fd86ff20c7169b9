"""GPM profiling (Hopper and later): SM, tensor, DRAM and pipe activity, PCIe and NVLink rates.

Each GPU keeps two sample buffers and alternates them: every run takes one new sample
and compares it with the previous run's, so nothing ever sleeps between two samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exporter.collectors.base import Context, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import Profiling
from exporter.nvml import const as N

MIB = 1024 * 1024
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
    have_previous: bool = False
    metric_ids: list[int] | None = None  # None until probed


class GpmCollector(GpuCollector):
    name = "gpm"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._state: dict[int, _GpuState] = {}

    def _gpu(self, index: int, h: Any) -> _GpuState:
        state = self._state.get(index)
        if state is None:
            support = self.nvml.query(N.nvmlGpmQueryDeviceSupport, h)
            state = _GpuState(supported=bool(support is not None and support.isSupportedDevice))
            if state.supported:
                state.samples = [N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()]
            self._state[index] = state
        return state

    def read(self, index: int, h: Any) -> Profiling | None:
        state = self._gpu(index, h)
        if not state.supported:
            return None
        current, previous = state.samples[1], state.samples[0]
        if self.nvml.query(N.nvmlGpmSampleGet, h, current) is None:
            return None
        state.samples.reverse()  # this sample is the next run's previous one
        if not state.have_previous:
            state.have_previous = True
            return None
        ids = state.metric_ids if state.metric_ids is not None else list(METRICS)
        got = self._metrics(previous, current, ids)
        if state.metric_ids is None:  # probe once: keep the ids this GPU answers
            state.metric_ids = [m for m in ids if m in got]
        values = {METRICS[m][0]: v * METRICS[m][1] for m, v in got.items()}
        return Profiling(**values)

    def _metrics(self, first: Any, second: Any, ids: list[int]) -> dict[int, float]:
        req = N.c_nvmlGpmMetricsGet_t()
        req.version = N.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(ids)
        req.sample1 = first
        req.sample2 = second
        for i, metric_id in enumerate(ids):
            req.metrics[i].metricId = metric_id
        if self.nvml.query(N.nvmlGpmMetricsGet, req) is None:
            return {}
        return {
            req.metrics[i].metricId: req.metrics[i].value
            for i in range(len(ids))
            if req.metrics[i].nvmlReturn == N.NVML_SUCCESS
        }

    def forget(self, index: int) -> None:
        self._state.pop(index, None)


@register("gpm", "GPM profiling: SM/tensor/DRAM activity, pipes, PCIe and NVLink rates (Hopper+)", nvml=True)
def _factory(ctx: Context) -> GpmCollector:
    return GpmCollector(ctx)
