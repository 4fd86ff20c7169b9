"""Compute processes on each GPU: the memory each holds, its share of the SMs over the last
window and its Kubernetes owner; and each owner's part of the GPU added up.

The driver lists only the processes visible from the caller's PID namespace (pids
translated into it, the others left out: exporter/environment.py). Outside the host's
namespace the list is empty or partial, so its count would be a wrong zero: the process
series are then left out, and `llmgpu_exporter_host_pid_namespace` says why.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import psutil

from exporter.collectors.base import Context, Output, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import GpuProcess, PidNamespace, Processes, Tenant
from exporter.metricdef import Labels
from exporter.nvml import MPS_SERVER, ProcessSample

NAMES_KEPT = 4096  # process names remembered at most, beyond the live ones


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
        # GPU -> the newest sample timestamp seen (us): the next read asks for newer ones,
        # so each read's window is the time since the last.
        self._cursor: dict[int, int] = {}
        self._owner_of = ctx.owner_of

    def forget(self, index: int) -> None:
        self._cursor.pop(index, None)

    def _name(self, pid: int) -> str:
        name = self._names.get(pid)
        if name is None:
            name = self._names[pid] = process_name(pid) or self.nvml.process_name(pid) or ""
        return name

    def read(self, index: int, h: Any) -> Processes | None:
        if self.host_pid_namespace is False:
            return None  # a filtered list: no count, no process series
        procs = self.query(self.nvml.compute_processes, h)
        if procs is None:
            return Processes()
        clients = self.query(self.nvml.mps_processes, h) or []
        samples = self._guard(lambda: self.nvml.process_utilization(h, self._cursor.get(index, 0)))
        holding: dict[int, int | None] = {}
        if clients:  # under MPS: the clients, not the server that runs their work
            holding.update(clients)
            holding.update((pid, used) for pid, used in procs if self._name(pid) != MPS_SERVER)
        else:
            holding.update(procs)
        sm, busy = self._activity(index, samples)
        # Processes that hold memory, or used the SMs in this window without holding any.
        pids = [*holding, *(pid for pid in sm if pid not in holding)]
        items = tuple(
            GpuProcess(
                pid=pid,
                process=self._name(pid),
                owner=self._owner_of(pid) if self._owner_of is not None else (),
                used_bytes=holding.get(pid),
                sm_ratio=None if samples is None else sm.get(pid, 0.0),
                memory_activity_ratio=None if samples is None else busy.get(pid, 0.0),
            )
            for pid in pids
        )
        if len(self._names) > NAMES_KEPT:
            self._names = {pid: n for pid, n in self._names.items() if pid in holding}
        return Processes(count=len(holding), items=items, tenants=tenants(items))

    def _activity(
        self, index: int, samples: list[ProcessSample] | None
    ) -> tuple[dict[int, float], dict[int, float]]:
        """Each process' mean SM and memory-controller share over the window's samples."""
        if not samples:
            return {}, {}
        self._cursor[index] = max(self._cursor.get(index, 0), *(s[1] for s in samples))
        sm: dict[int, list[int]] = defaultdict(list)
        busy: dict[int, list[int]] = defaultdict(list)
        for pid, _, sm_pct, mem_pct in samples:
            sm[pid].append(sm_pct)
            busy[pid].append(mem_pct)
        return (
            {pid: min(1.0, sum(v) / len(v) / 100) for pid, v in sm.items()},
            {pid: min(1.0, sum(v) / len(v) / 100) for pid, v in busy.items()},
        )

    def collect(self) -> Output:
        out = super().collect()
        if self.host_pid_namespace is None:
            return out
        return dataclasses.replace(out, node=(PidNamespace(host=int(self.host_pid_namespace)),))


def tenants(items: tuple[GpuProcess, ...]) -> tuple[Tenant, ...]:
    """The processes that have an owner, added up by owner."""
    by_owner: dict[Labels, list[GpuProcess]] = defaultdict(list)
    for p in items:
        if p.owner:
            by_owner[p.owner].append(p)
    out = []
    for owner, procs in sorted(by_owner.items()):
        sms = [p.sm_ratio for p in procs if p.sm_ratio is not None]
        held = [p.used_bytes for p in procs if p.used_bytes is not None]
        out.append(
            Tenant(
                owner=owner,
                sm_ratio=min(1.0, sum(sms)) if sms else None,
                used_bytes=sum(held) if held else None,
                processes=len(procs),
            )
        )
    return tuple(out)


@register("processes", "Compute processes per GPU: memory, SM share, owner (every 5 intervals)", nvml=True)
def _factory(ctx: Context) -> ProcessesCollector:
    return ProcessesCollector(ctx)
