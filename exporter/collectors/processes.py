"""Compute processes on each GPU and the memory each one holds.

The driver lists only the processes visible from the caller's PID namespace (pids
translated into it, the others left out: exporter/environment.py). Outside the host's
namespace the list is empty or partial, so its count would be a wrong zero: the process
series are then left out, and `llmgpu_exporter_host_pid_namespace` says why.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import psutil

from exporter.collectors.base import Context, Output, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import GpuProcess, PidNamespace, Processes


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
        self.host_pid_namespace = ctx.host_pid_namespace

    def read(self, index: int, h: Any) -> Processes | None:
        if self.host_pid_namespace is False:
            return None  # a filtered list: no count, no process series
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

    def collect(self) -> Output:
        out = super().collect()
        if self.host_pid_namespace is None:
            return out
        return dataclasses.replace(out, node=(PidNamespace(host=int(self.host_pid_namespace)),))


@register("processes", "Compute processes per GPU with their memory (every 5 intervals)", nvml=True)
def _factory(ctx: Context) -> ProcessesCollector:
    return ProcessesCollector(ctx)
