"""Shared loop of the per-GPU NVML collectors: one GPU failing never stops the others."""

from __future__ import annotations

from collections import Counter
from typing import Any

from exporter.collectors.base import Collector, Context, Output
from exporter.metricdef import has_value
from exporter.nvml import DEVICE_GONE, Nvml, NvmlError


class GpuCollector(Collector):
    """Subclasses set `name`, `default_interval` and implement `read()` for one GPU.

    `forget(index)` drops what a subclass keeps per GPU once the GPU stopped answering,
    so a GPU that comes back starts afresh.
    """

    name = ""
    default_interval = 1.0  # in multiples of Settings.interval when `follows_interval`
    follows_interval = True

    def __init__(self, ctx: Context) -> None:
        assert ctx.nvml is not None
        self.nvml: Nvml = ctx.nvml
        base = ctx.settings.interval
        self.interval_s = base * self.default_interval if self.follows_interval else self.default_interval

    def read(self, index: int, handle: Any) -> object | None:
        raise NotImplementedError

    def forget(self, index: int) -> None:
        """Drop per-GPU state; nothing for collectors that keep none."""

    def collect(self) -> Output:
        gpus: dict[int, tuple[object, ...]] = {}
        gpu_errors: dict[int, str] = {}
        unsupported: dict[int, tuple[str, ...]] = {}
        errors: Counter[str] = Counter()
        for index in range(self.nvml.count):
            try:
                reading = self.read(index, self.nvml.handle(index))
            except NvmlError as err:
                gpu_errors[index] = err.name
                errors[err.name] += 1
                if err.name in DEVICE_GONE:
                    self.nvml.forget(index)
                    self.forget(index)
                continue
            if reading is not None and has_value(reading):
                gpus[index] = (reading,)
            else:
                unsupported[index] = (self.name,)
        return Output(gpus=gpus, gpu_errors=gpu_errors, errors=dict(errors), unsupported=unsupported)
