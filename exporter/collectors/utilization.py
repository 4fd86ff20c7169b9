"""GPU and memory busy time as NVML counts it (the share of time a kernel or copy ran)."""

from __future__ import annotations

from typing import Any

from exporter.collectors.base import Context, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import Utilization
from exporter.nvml import const as N


class UtilizationCollector(GpuCollector):
    name = "utilization"

    def read(self, index: int, h: Any) -> Utilization:
        u = self.query(N.nvmlDeviceGetUtilizationRates, h)
        if u is None:
            return Utilization()
        return Utilization(gpu_busy_ratio=u.gpu / 100, memory_busy_ratio=u.memory / 100)


@register("utilization", "NVML GPU and memory busy time", nvml=True)
def _utilization(ctx: Context) -> UtilizationCollector:
    return UtilizationCollector(ctx)
