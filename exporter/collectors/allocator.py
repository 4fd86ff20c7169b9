"""PyTorch caching-allocator state from the probe files that engine processes write.

The textfile-collector pattern: the probe inside each engine process writes a small
JSON file, this collector reads the directory. Fragmentation is invisible to NVML.
"""

from __future__ import annotations

import time

from exporter.allocator_readings import AllocatorProbes, AllocatorProcess
from exporter.collectors.base import Collector, Context, Output, register
from exporter.nvml import Nvml, NvmlError, decode
from exporter.nvml import const as N
from exporter.probe.reader import REJECT_REASONS, scan_probe_dir
from exporter.probe.schema import ProbeState


class AllocatorCollector(Collector):
    name = "allocator"

    def __init__(self, ctx: Context) -> None:
        self.directory = ctx.settings.probe_dir
        self.max_age = ctx.settings.probe_max_age
        self.interval_s = max(5.0, ctx.settings.interval * 5)
        self.nvml: Nvml | None = ctx.nvml
        self._gpu_of: dict[str, int] = {}

    def _gpu_index(self, uuid: str | None) -> str:
        if not uuid or self.nvml is None:
            return ""
        if uuid not in self._gpu_of:
            for i in range(self.nvml.count):
                try:
                    found = decode(self.nvml.query(N.nvmlDeviceGetUUID, self.nvml.handle(i)) or "")
                except NvmlError:
                    continue
                self._gpu_of[found] = i
        index = self._gpu_of.get(uuid)
        return "" if index is None else str(index)

    def collect(self) -> Output:
        # Probe files carry wall-clock timestamps, so staleness is judged on wall time.
        scan = scan_probe_dir(self.directory, now=time.time(), max_age_s=self.max_age)
        if not scan.directory_present:
            return Output()
        processes = tuple(
            AllocatorProcess(
                gpu=self._gpu_index(r.uuid),
                uuid=r.uuid or "",
                pid=r.pid,
                reserved_bytes=r.reserved_bytes,
                allocated_bytes=r.allocated_bytes,
                free_bytes=r.large_free_bytes,
                largest_free_block_bytes=r.largest_free_block_bytes,
                fragmentation_ratio=r.fragmentation_ratio,
                alloc_retries=r.alloc_retries_total,
                ooms=r.ooms_total,
            )
            for r in scan.reports
            if r.cuda_available
        )
        states = dict.fromkeys(sorted(ProbeState.ALL), 0)
        for r in scan.reports:
            states[r.state] = states.get(r.state, 0) + 1
        reading = AllocatorProbes(
            processes=processes,
            probes=states,
            rejected={reason: scan.rejected.get(reason, 0) for reason in REJECT_REASONS},
            reports=scan.reports,
        )
        return Output(node=(reading,))


@register("allocator", "PyTorch allocator state and fragmentation from engine-side probe files")
def _factory(ctx: Context) -> AllocatorCollector:
    return AllocatorCollector(ctx)
