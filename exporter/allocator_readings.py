"""Allocator readings: PyTorch caching-allocator state per engine process, from the probe files.

Each field declares the metric it is exposed as; `None` is a value the probe did not report.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.metricdef import counter, gauge, label, nested
from exporter.probe.schema import ProbeReport


@dataclass(frozen=True)
class AllocatorProcess:
    gpu: str = label()
    uuid: str = label()
    pid: int = label()
    reserved_bytes: int | None = gauge(
        "llmgpu_allocator_reserved_bytes", "Memory the caching allocator holds from the driver (probe)"
    )
    allocated_bytes: int | None = gauge(
        "llmgpu_allocator_allocated_bytes", "Memory handed out to live tensors (probe)"
    )
    free_bytes: int | None = gauge(
        "llmgpu_allocator_free_bytes", "Free memory inside the allocator's large segments (probe)"
    )
    largest_free_block_bytes: int | None = gauge(
        "llmgpu_allocator_largest_free_block_bytes",
        "Largest free block in a large segment: the biggest allocation served without cudaMalloc (probe)",
    )
    fragmentation_ratio: float | None = gauge(
        "llmgpu_allocator_fragmentation_ratio",
        "External fragmentation, 1 - largest free block / total free (probe)",
    )
    alloc_retries: int | None = counter(
        "llmgpu_allocator_alloc_retries_total",
        "Allocations that had to free cached blocks and retry; resets with the process (probe)",
    )
    ooms: int | None = counter(
        "llmgpu_allocator_ooms_total",
        "Out-of-memory errors raised by the allocator; resets with the process (probe)",
    )


@dataclass(frozen=True)
class AllocatorProbes:
    processes: tuple[AllocatorProcess, ...] = nested(AllocatorProcess)
    probes: dict[str, int] | None = gauge(
        "llmgpu_allocator_probes",
        "Fresh probe files by the probe's state: no_cuda, sampling, failed... (probe)",
        label="state",
    )
    rejected: dict[str, int] | None = gauge(
        "llmgpu_allocator_probe_files_rejected",
        "Probe files ignored in the last scan by reason: malformed, stale, dead_pid... (probe)",
        label="reason",
    )
    reports: tuple[ProbeReport, ...] = ()  # for the diagnosis; not exported
