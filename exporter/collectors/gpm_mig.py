"""GPM activity per MIG GPU instance (Hopper and later, MIG mode on): SM, tensor, DRAM.

nvml.h offers two ways: nvmlGpmMigSampleGet(parent, GPU instance id), a sample of the
whole GPU instance, and nvmlGpmSampleGet on a MIG device handle, a sample of one compute
instance. DCGM samples its GPU-instance entities the first way, and only those with a
compute instance (DcgmGpmManager.cpp): so does this collector, keeping two sample
buffers per GPU instance that it alternates like the whole-GPU GPM collector. What GPM
answers on the MIG-enabled parent itself no source says; `selfcheck` records it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from exporter.collectors.base import Context, register
from exporter.collectors.gpm import MIN_SAMPLE_GAP_S, metrics_between
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import MigActivity, MigProfiling
from exporter.nvml import NvmlError, function
from exporter.nvml import const as N

METRICS = {
    N.NVML_GPM_METRIC_SM_UTIL: "sm_active_ratio",
    N.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_active_ratio",
    N.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_active_ratio",
}


@dataclass
class _Instance:
    samples: list[Any] = field(default_factory=list)
    taken_at: float | None = None
    last: MigActivity | None = None


class GpmMigCollector(GpuCollector):
    name = "gpm_mig"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.clock = ctx.clock
        self.nvml.before_restart(self.stop)  # free the buffers while their session exists
        self._supported: dict[int, bool] = {}
        self._instances: dict[tuple[int, int], _Instance] = {}  # (GPU, GPU instance id)

    def _gpu_instances(self, h: Any) -> list[int]:
        """Ids of the GPU instances with a compute instance: their MIG devices' parents."""
        ids: set[int] = set()
        for mh in self.mig_devices(h):
            gi = self.query(N.nvmlDeviceGetGpuInstanceId, mh)
            if gi is not None:
                ids.add(int(gi))
        return sorted(ids)

    def read(self, index: int, h: Any) -> MigProfiling | None:
        if index not in self._supported:
            support = self.query(N.nvmlGpmQueryDeviceSupport, h)
            self._supported[index] = bool(support is not None and support.isSupportedDevice)
        if not self._supported[index]:
            return None
        # MIG mode and its instances change only on an admin's doing: read them every HELD_S
        mode = self.held(index, "mig_mode", lambda: self.query(N.nvmlDeviceGetMigMode, h))
        if mode is None or not mode[0]:
            self._drop(index)
            return None
        ids = self.held(index, "gpu_instances", lambda: self._gpu_instances(h))
        for gone in [k for k in self._instances if k[0] == index and k[1] not in ids]:
            self._release(gone)  # a GPU instance destroyed since
        got = [a for gi in ids if (a := self._activity(index, h, gi)) is not None]
        return MigProfiling(instances=tuple(got))

    def _activity(self, index: int, h: Any, gi: int) -> MigActivity | None:
        inst = self._instances.setdefault((index, gi), _Instance())
        while len(inst.samples) < 2:
            sample = self.query(N.nvmlGpmSampleAlloc)
            if sample is None:
                return None
            inst.samples.append(sample)
        now = self.clock()
        if inst.taken_at is not None and now - inst.taken_at < MIN_SAMPLE_GAP_S:
            return inst.last
        current, previous = inst.samples[1], inst.samples[0]
        if self.query(function("nvmlGpmMigSampleGet"), h, gi, current) is None:
            return None
        inst.samples.reverse()
        first, inst.taken_at = inst.taken_at is None, now
        if first:
            return None
        got = {
            m: v
            for m, v in (metrics_between(self, previous, current, list(METRICS)) or {}).items()
            if not math.isnan(v)
        }
        if not got:  # NaN is a blank, as DCGM makes it
            return None
        inst.last = MigActivity(gpu_instance=gi, **{METRICS[m]: v * 0.01 for m, v in got.items()})
        return inst.last

    def _release(self, key: tuple[int, int]) -> None:
        for sample in self._instances.pop(key).samples:
            try:
                self.nvml.query(N.nvmlGpmSampleFree, sample)
            except NvmlError:
                continue

    def _drop(self, index: int) -> None:
        for key in [k for k in self._instances if k[0] == index]:
            self._release(key)

    def forget(self, index: int) -> None:
        self._drop(index)
        self._supported.pop(index, None)

    def stop(self) -> None:
        for index in {k[0] for k in self._instances}:
            self.forget(index)


@register("gpm_mig", "GPM SM/tensor/DRAM activity per MIG GPU instance (Hopper+, MIG mode)", nvml=True)
def _factory(ctx: Context) -> GpmMigCollector:
    return GpmMigCollector(ctx)
