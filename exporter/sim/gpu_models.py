"""The simulated GPU parts: what the fake library reports for each model a scenario names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_bytes: int
    power_limit_watts: float  # the default enforced limit, also the largest settable
    sm_clock_max_hertz: float
    memory_clock_max_hertz: float
    nvlinks: int
    gpm: bool  # GPM profiling metrics (Hopper and later)
    pcie_generation: int
    pcie_width: int = 16
    multiprocessors: int = 132
    memory_reserved_bytes: int = 512 * 1024**2  # nvmlMemory_v2_t.reserved: driver and firmware


GIB = 1024**3
POWER_LIMIT_MIN_RATIO = 0.3  # the smallest settable limit, of the largest (nvml...LimitConstraints)
MODELS: dict[str, GpuModel] = {
    "H100-80GB-SXM": GpuModel("NVIDIA H100 80GB HBM3", 80 * GIB, 700.0, 1980e6, 2619e6, 18, True, 5),
    "H200-141GB-SXM": GpuModel("NVIDIA H200", 141 * GIB, 700.0, 1980e6, 3201e6, 18, True, 5),
    "A100-80GB-SXM": GpuModel(
        "NVIDIA A100-SXM4-80GB", 80 * GIB, 400.0, 1410e6, 1593e6, 12, False, 4, 16, 108
    ),
    "L4": GpuModel("NVIDIA L4", 24 * GIB, 72.0, 2040e6, 6251e6, 0, False, 4, 16, 58),
    "L40S": GpuModel("NVIDIA L40S", 48 * GIB, 350.0, 2520e6, 9001e6, 0, False, 4, 16, 142),
    "GH200-96GB": GpuModel("NVIDIA GH200 480GB", 96 * GIB, 900.0, 1980e6, 2619e6, 18, True, 5),
    "RTX-4090": GpuModel("NVIDIA GeForce RTX 4090", 24 * GIB, 450.0, 3105e6, 10501e6, 0, False, 4, 16, 128),
}
