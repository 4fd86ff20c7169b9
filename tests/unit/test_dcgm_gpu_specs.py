"""The GPU-spec table: NVML names find their datasheet row; an unknown part stays unknown."""

from __future__ import annotations

import pytest

from exporter.gpu_specs import SPECS, spec_of

# nvmlDeviceGetName answers -> (row, DRAM bytes/s, dense BF16, has FP8)
NAMES = [
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", 2039e9, 312e12, False),
    ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB", 1555e9, 312e12, False),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 1935e9, 312e12, False),
    ("NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB", 1555e9, 312e12, False),
    ("NVIDIA A30", "A30", 933e9, 165e12, False),
    ("NVIDIA A10", "A10", 600e9, 125e12, False),
    ("NVIDIA L4", "L4", 300e9, 121e12, True),
    ("NVIDIA L40", "L40", 864e9, 181e12, True),
    ("NVIDIA L40S", "L40S", 864e9, 362e12, True),
    ("NVIDIA H100 PCIe", "H100 PCIe", 2000e9, 756e12, True),
    ("NVIDIA H100 80GB HBM3", "H100", 3350e9, 989.5e12, True),
    ("NVIDIA H100 NVL", "H100 NVL", 3900e9, 835.5e12, True),
    ("NVIDIA H200", "H200", 4800e9, 989.5e12, True),
    ("NVIDIA H200 NVL", "H200 NVL", 4800e9, 835.5e12, True),
    ("NVIDIA GH200 480GB", "GH200", 4000e9, 989.5e12, True),
    ("NVIDIA GH200 144G HBM3e", "GH200 144G", 4900e9, 989.5e12, True),
    ("NVIDIA B200", "B200", 8000e9, 2.25e15, True),
    ("NVIDIA GB200", "GB200", 8000e9, 2.5e15, True),
]


@pytest.mark.parametrize(("name", "row", "dram", "bf16", "fp8"), NAMES)
def test_each_part_finds_its_own_row(name: str, row: str, dram: float, bf16: float, fp8: bool) -> None:
    spec = spec_of(name)
    assert spec is not None and spec.match == row
    assert spec.dram_bandwidth_bytes_per_second == dram and spec.peak_bf16_flops == bf16
    assert ("fp8" in spec.flops) is fp8
    assert spec.flops.get("fp16") == bf16  # dense FP16 equals dense BF16 on every one of these
    assert spec.flops["fp32"] < bf16  # the non-tensor FP32 peak


def test_unknown_parts_stay_unknown() -> None:
    assert spec_of("NVIDIA GeForce RTX 4090") is None
    assert spec_of("NVIDIA A100X") is None  # no datasheet row: nothing is assumed from "A100"
    a10g = spec_of("NVIDIA A10G")
    assert a10g is not None and a10g.match == "A10G"  # not the A10's numbers
    assert a10g.dram_bandwidth_bytes_per_second is None and a10g.peak_bf16_flops is None


def test_no_row_is_shadowed_by_an_earlier_one() -> None:
    for row in SPECS:
        assert spec_of(f"NVIDIA {row.match}") is row, f"{row.match!r} is shadowed"


def test_the_peaks_the_shipped_h100_findings_rest_on() -> None:
    spec = spec_of("NVIDIA H100 80GB HBM3")
    assert spec is not None and spec.dram_bandwidth_bytes_per_second == 3350e9 and spec.gpm
