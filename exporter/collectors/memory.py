"""Framebuffer memory (used, free, reserved) and the BAR1 aperture."""

from __future__ import annotations

from typing import Any

from exporter.collectors.base import Context, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import Memory
from exporter.nvml import const as N


class MemoryCollector(GpuCollector):
    name = "memory"

    def read(self, index: int, h: Any) -> Memory:
        m = self.query_versioned(
            "nvmlDeviceGetMemoryInfo",
            [
                lambda: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2),
                lambda: N.nvmlDeviceGetMemoryInfo(h),
            ],
        )
        bar1 = self.held(index, "bar1", lambda: self.query(N.nvmlDeviceGetBAR1MemoryInfo, h))
        return Memory(
            used_bytes=m.used if m is not None else None,
            free_bytes=m.free if m is not None else None,
            reserved_bytes=getattr(m, "reserved", None),
            bar1_used_bytes=bar1.bar1Used if bar1 is not None else None,
            bar1_total_bytes=bar1.bar1Total if bar1 is not None else None,
        )


@register("memory", "Framebuffer used/free/reserved and BAR1", nvml=True)
def _memory(ctx: Context) -> MemoryCollector:
    return MemoryCollector(ctx)
