"""Compute processes on each GPU and the memory each one holds."""

from __future__ import annotations

from typing import Any

import psutil

from exporter.collectors.base import Context, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import GpuProcess, Processes


def process_name(pid: int) -> str:
    """The process' name when it is visible from here (hostPID), else empty."""
    try:
        return str(psutil.Process(pid).name())
    except (psutil.Error, ValueError):
        return ""


class ProcessesCollector(GpuCollector):
    name = "processes"
    default_interval = 5.0

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._names: dict[int, str] = {}  # pid -> name; pids are reused rarely enough

    def read(self, index: int, h: Any) -> Processes:
        procs = self.query(self.nvml.compute_processes, h)
        if procs is None:
            return Processes()
        items = []
        for pid, used in procs:
            name = self._names.get(pid)
            if name is None:
                name = self._names[pid] = process_name(pid)
            items.append(GpuProcess(pid=pid, process=name, used_bytes=used))
        live = {pid for pid, _ in procs}
        for pid in [pid for pid in self._names if pid not in live and len(self._names) > 4096]:
            del self._names[pid]
        return Processes(count=len(items), items=tuple(items))


@register("processes", "Compute processes per GPU with their memory (every 5 intervals)", nvml=True)
def _factory(ctx: Context) -> ProcessesCollector:
    return ProcessesCollector(ctx)
