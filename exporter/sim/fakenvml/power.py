# mypy: disable-error-code="no-any-return"
"""The fake NVML library's power area: draw, the enforced limit and the range it may be
set in, the energy counter, and the die and HBM temperatures."""

from __future__ import annotations

from typing import Any

from exporter.nvml import FI_MEMORY_TEMP
from exporter.sim.fakenvml.abi import OK, Library, field, out, symbol


@symbol("nvmlDeviceGetPowerUsage")
def power_usage(lib: Library, h: Any, ref: Any) -> int:
    g = lib.gpu_of(h)
    out(ref).value = round(lib.v(g, "power_ratio") * lib.model.power_limit_watts * 1000)
    return OK


@symbol("nvmlDeviceGetEnforcedPowerLimit")
def enforced_power_limit(lib: Library, h: Any, ref: Any) -> int:
    out(ref).value = int(lib.model.power_limit_watts * 1000)
    return OK


@symbol("nvmlDeviceGetPowerManagementLimitConstraints")
def power_limit_constraints(lib: Library, h: Any, lo: Any, hi: Any) -> int:
    out(lo).value = int(lib.model.power_limit_watts * 1000 * 0.3)
    out(hi).value = int(lib.model.power_limit_watts * 1000)
    return OK


@symbol("nvmlDeviceGetTotalEnergyConsumption")
def total_energy_consumption(lib: Library, h: Any, ref: Any) -> int:
    g = lib.gpu_of(h)
    joules = lib.t.gpu_integral(g, "power_ratio") * lib.model.power_limit_watts
    out(ref).value = int(joules * 1000)
    return OK


@symbol("nvmlDeviceGetTemperature")
def temperature(lib: Library, h: Any, sensor: Any, ref: Any) -> int:
    out(ref).value = round(lib.v(lib.gpu_of(h), "temp_c"))
    return OK


@field(FI_MEMORY_TEMP)
def memory_temperature(lib: Library, g: int, fid: int, scope: int) -> float | None:
    return lib.v(g, "mem_temp_c")
