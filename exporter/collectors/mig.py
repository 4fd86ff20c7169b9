"""MIG: mode per GPU and, where it is on, memory and SMs of each instance."""

from __future__ import annotations

from typing import Any

from exporter.collectors.base import Context, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import Mig, MigInstance
from exporter.nvml import const as N
from exporter.nvml import decode


class MigCollector(GpuCollector):
    name = "mig"
    default_interval = 5.0

    def read(self, index: int, h: Any) -> Mig | None:
        q = self.query
        mode = q(N.nvmlDeviceGetMigMode, h)
        if mode is None:
            return None
        if not mode[0]:
            return Mig(enabled=0)
        instances = []
        for mh in self.mig_devices(h):
            memory = q(N.nvmlDeviceGetMemoryInfo, mh)
            attrs = q(N.nvmlDeviceGetAttributes, mh)
            instances.append(
                MigInstance(
                    mig_uuid=decode(q(N.nvmlDeviceGetUUID, mh) or ""),
                    gpu_instance=q(N.nvmlDeviceGetGpuInstanceId, mh),
                    compute_instance=q(N.nvmlDeviceGetComputeInstanceId, mh),
                    memory_used_bytes=memory.used if memory is not None else None,
                    memory_total_bytes=memory.total if memory is not None else None,
                    multiprocessors=attrs.multiprocessorCount if attrs is not None else None,
                )
            )
        return Mig(enabled=1, instances=tuple(instances))


@register("mig", "MIG mode and per-instance memory and SMs (every 5 intervals)", nvml=True)
def _factory(ctx: Context) -> MigCollector:
    return MigCollector(ctx)
