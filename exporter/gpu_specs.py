"""Datasheet facts of the GPU parts the exporter knows, in one table.

NVML reports a GPU's name but not what the part can do at best; the diagnosis needs
that to turn measured activity into a share of the peak (DRAM bandwidth for MBU and the
bandwidth-bound rule, dense tensor FLOP/s for MFU). Rows are matched by a fragment of
the name NVML reports (`nvmlDeviceGetName`); the first matching row wins, so a more
specific fragment comes before a shorter one it contains ("H100 PCIe" before "H100",
"L40S" before "L40" before "L4"). A part no row matches is unknown: its peaks are
`None` and nothing is assumed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

GIB = 1024**3


@dataclass(frozen=True)
class GpuSpec:
    match: str  # fragment of nvmlDeviceGetName's answer
    dram_bandwidth_bytes_per_second: float | None
    # Dense (no sparsity) peak per precision, tensor cores where the part has them.
    flops: Mapping[str, float] = field(default_factory=dict)
    nvlinks: int | None = None  # NVLink links on the part; 0 for PCIe-only parts
    gpm: bool = False  # NVML GPM profiling metrics (Hopper and later)
    memory_bytes: int | None = None

    @property
    def peak_bf16_flops(self) -> float | None:
        return self.flops.get("bf16")


SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("GB200", 8000e9, {"bf16": 2.5e15}, nvlinks=18, gpm=True),
    GpuSpec("B200", 8000e9, {"bf16": 2.25e15}, nvlinks=18, gpm=True, memory_bytes=180 * GIB),
    GpuSpec("H200", 4800e9, {"bf16": 989e12}, nvlinks=18, gpm=True, memory_bytes=141 * GIB),
    GpuSpec("H100 NVL", 3900e9, {"bf16": 989e12}, gpm=True, memory_bytes=94 * GIB),
    GpuSpec("H100 PCIe", 2000e9, {"bf16": 756e12}, nvlinks=0, gpm=True, memory_bytes=80 * GIB),
    GpuSpec("H100", 3350e9, {"bf16": 989e12}, nvlinks=18, gpm=True, memory_bytes=80 * GIB),
    GpuSpec("H800", 3350e9, {"bf16": 989e12}, gpm=True, memory_bytes=80 * GIB),
    GpuSpec("A100-SXM4-80GB", 2039e9, {"bf16": 312e12}, nvlinks=12, memory_bytes=80 * GIB),
    GpuSpec("A100 80GB PCIe", 1935e9, {"bf16": 312e12}, memory_bytes=80 * GIB),
    GpuSpec("A100", 1555e9, {"bf16": 312e12}, memory_bytes=40 * GIB),
    GpuSpec("A800", None, {"bf16": 312e12}),
    GpuSpec("L40S", 864e9, {"bf16": 362e12}, nvlinks=0, memory_bytes=48 * GIB),
    GpuSpec("L40", 864e9, {"bf16": 181e12}, nvlinks=0, memory_bytes=48 * GIB),
    GpuSpec("L4", 300e9, {"bf16": 121e12}, nvlinks=0, memory_bytes=24 * GIB),
    GpuSpec("A10G", 600e9, {"bf16": 70e12}, nvlinks=0, memory_bytes=24 * GIB),
    GpuSpec("A10", 600e9, {"bf16": 125e12}, nvlinks=0, memory_bytes=24 * GIB),
)


def spec_of(name: str) -> GpuSpec | None:
    """The row for a GPU name as NVML reports it, or None for a part not in the table."""
    return next((s for s in SPECS if s.match in name), None)
