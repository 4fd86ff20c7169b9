"""Datasheet facts of the GPU parts the exporter knows, in one table.

NVML reports a GPU's name but not what the part can do at best; the diagnosis needs
that to turn measured activity into a share of the peak (DRAM bandwidth for MBU and the
bandwidth-bound rule, dense tensor FLOP/s for MFU). Rows are matched by a fragment of
the name NVML reports (`nvmlDeviceGetName`), as whole words ("A10" does not match
"A100X"); the first matching row wins, so a more specific fragment comes before a
shorter one it starts with ("H100 PCIe" before "H100", "GH200 144G" before "GH200"). A
part no row matches is unknown: its peaks are `None` and nothing is assumed.
"""

from __future__ import annotations

import re
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


# Dense peaks (sparsity halved away) from NVIDIA's datasheets, one comment per row naming
# it. `flops` keys: bf16, fp16 and fp8 are tensor-core peaks, fp32 the non-tensor FP32
# (CUDA-core) peak. A precision the part lacks (FP8 before Ada/Hopper) has no key.
# "A10G" has a row of its own so that it stays unknown rather than borrowing the A10's.
SPECS: tuple[GpuSpec, ...] = (
    # GB200 NVL72 datasheet (2024), per GPU: 576 TB/s / 72, 360 PF BF16 sparse / 72
    GpuSpec(
        "GB200",
        8000e9,
        {"bf16": 2.5e15, "fp16": 2.5e15, "fp8": 5e15, "fp32": 80e12},
        nvlinks=18,
        gpm=True,
    ),
    # HGX B200 datasheet (2024), per GPU of eight: 8 TB/s, 36 PF BF16 sparse / 8
    GpuSpec(
        "B200",
        8000e9,
        {"bf16": 2.25e15, "fp16": 2.25e15, "fp8": 4.5e15, "fp32": 75e12},
        nvlinks=18,
        gpm=True,
        memory_bytes=180 * GIB,
    ),
    # GH200 Grace Hopper Superchip datasheet (2024): HBM3e 144 GB at 4.9 TB/s
    GpuSpec(
        "GH200 144G",
        4900e9,
        {"bf16": 989.5e12, "fp16": 989.5e12, "fp8": 1979e12, "fp32": 67e12},
        nvlinks=18,
        gpm=True,
    ),
    # GH200 Grace Hopper Superchip datasheet (2024): HBM3 96 GB at 4 TB/s ("GH200 480GB")
    GpuSpec(
        "GH200",
        4000e9,
        {"bf16": 989.5e12, "fp16": 989.5e12, "fp8": 1979e12, "fp32": 67e12},
        nvlinks=18,
        gpm=True,
    ),
    # H200 Tensor Core GPU datasheet (2024), H200 NVL column
    GpuSpec(
        "H200 NVL",
        4800e9,
        {"bf16": 835.5e12, "fp16": 835.5e12, "fp8": 1670.5e12, "fp32": 60e12},
        gpm=True,
        memory_bytes=141 * GIB,
    ),
    # H200 Tensor Core GPU datasheet (2024), H200 SXM column
    GpuSpec(
        "H200",
        4800e9,
        {"bf16": 989.5e12, "fp16": 989.5e12, "fp8": 1979e12, "fp32": 67e12},
        nvlinks=18,
        gpm=True,
        memory_bytes=141 * GIB,
    ),
    # H100 Tensor Core GPU datasheet (2024), H100 NVL column
    GpuSpec(
        "H100 NVL",
        3900e9,
        {"bf16": 835.5e12, "fp16": 835.5e12, "fp8": 1670.5e12, "fp32": 60e12},
        gpm=True,
        memory_bytes=94 * GIB,
    ),
    # H100 Tensor Core GPU datasheet (2024), H100 PCIe column
    GpuSpec(
        "H100 PCIe",
        2000e9,
        {"bf16": 756e12, "fp16": 756e12, "fp8": 1513e12, "fp32": 51e12},
        nvlinks=0,
        gpm=True,
        memory_bytes=80 * GIB,
    ),
    # H100 Tensor Core GPU datasheet (2024), H100 SXM column (1,979 TF BF16 with sparsity, halved)
    GpuSpec(
        "H100",
        3350e9,
        {"bf16": 989.5e12, "fp16": 989.5e12, "fp8": 1979e12, "fp32": 67e12},
        nvlinks=18,
        gpm=True,
        memory_bytes=80 * GIB,
    ),
    # China-market H100 SXM variant: no datasheet of its own; the H100 SXM's compute
    GpuSpec("H800", 3350e9, {"bf16": 989e12}, gpm=True, memory_bytes=80 * GIB),
    # A100 Tensor Core GPU datasheet (2021): 80 GB SXM
    GpuSpec(
        "A100-SXM4-80GB",
        2039e9,
        {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
        nvlinks=12,
        memory_bytes=80 * GIB,
    ),
    # A100 Tensor Core GPU datasheet (2021): 40 GB SXM
    GpuSpec(
        "A100-SXM4-40GB",
        1555e9,
        {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
        nvlinks=12,
        memory_bytes=40 * GIB,
    ),
    # A100 Tensor Core GPU datasheet (2021): 80 GB PCIe
    GpuSpec(
        "A100 80GB PCIe",
        1935e9,
        {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
        memory_bytes=80 * GIB,
    ),
    # A100 Tensor Core GPU datasheet (2021): 40 GB PCIe
    GpuSpec(
        "A100-PCIE-40GB",
        1555e9,
        {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
        memory_bytes=40 * GIB,
    ),
    # China-market A100 variant: no datasheet bandwidth; the A100's tensor peak
    GpuSpec("A800", None, {"bf16": 312e12}),
    # A30 Tensor Core GPU datasheet (2021)
    GpuSpec(
        "A30",
        933e9,
        {"bf16": 165e12, "fp16": 165e12, "fp32": 10.3e12},
        memory_bytes=24 * GIB,
    ),
    # L40S GPU datasheet (2023)
    GpuSpec(
        "L40S",
        864e9,
        {"bf16": 362e12, "fp16": 362e12, "fp8": 733e12, "fp32": 91.6e12},
        nvlinks=0,
        memory_bytes=48 * GIB,
    ),
    # L40 GPU datasheet (2022)
    GpuSpec(
        "L40",
        864e9,
        {"bf16": 181e12, "fp16": 181e12, "fp8": 362e12, "fp32": 90.5e12},
        nvlinks=0,
        memory_bytes=48 * GIB,
    ),
    # L4 Tensor Core GPU datasheet (2023)
    GpuSpec(
        "L4",
        300e9,
        {"bf16": 121e12, "fp16": 121e12, "fp8": 242.5e12, "fp32": 30.3e12},
        nvlinks=0,
        memory_bytes=24 * GIB,
    ),
    # AWS's A10G has no NVIDIA datasheet: its peaks stay unknown (AWS documents 24 GB)
    GpuSpec("A10G", None, nvlinks=0, memory_bytes=24 * GIB),
    # A10 Tensor Core GPU datasheet (2021)
    GpuSpec(
        "A10",
        600e9,
        {"bf16": 125e12, "fp16": 125e12, "fp32": 31.2e12},
        nvlinks=0,
        memory_bytes=24 * GIB,
    ),
)


def _matches(fragment: str, name: str) -> bool:
    """The fragment as whole words of the name: "A10" is not in "A100X", "H200" not in "GH200"."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(fragment)}(?![A-Za-z0-9])", name) is not None


def spec_of(name: str) -> GpuSpec | None:
    """The row for a GPU name as NVML reports it, or None for a part not in the table."""
    return next((s for s in SPECS if _matches(s.match, name)), None)
