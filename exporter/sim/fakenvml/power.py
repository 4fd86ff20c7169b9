# mypy: disable-error-code="no-any-return"
"""The fake NVML library's power area: draw, the enforced limit and the range it may be
set in, the energy counter, and the die and HBM temperatures.

The enforced limit is the timeline's `power_limit_watts` (the model's own unless a phase
lowers it, as a rack's power budget or `nvidia-smi -pl` would); draw is `power_ratio` of
it, and the energy counter is the integral of that draw. The settable range stays the
part's. Power values are milliwatts, energy millijoules, as nvml.h has them.
"""

from __future__ import annotations

from typing import Any

import pynvml as N

from exporter.nvml import FI_MEMORY_TEMP
from exporter.sim.fakenvml.abi import OK, Library, field, out, symbol
from exporter.sim.gpu_models import POWER_LIMIT_MIN_RATIO


def limit_milliwatts(lib: Library, g: int) -> int:
    return int(lib.t.gpu(g, "power_limit_watts") * 1000)


@symbol("nvmlDeviceGetPowerUsage")
def power_usage(lib: Library, h: Any, ref: Any) -> int:
    g = lib.gpu_of(h)
    out(ref).value = round(lib.v(g, "power_ratio") * lib.t.gpu(g, "power_limit_watts") * 1000)
    return OK


# No other limit (an in-band or host-side one) applies here: the one set is the one enforced.
@symbol("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit")
def power_limit(lib: Library, h: Any, ref: Any) -> int:
    out(ref).value = limit_milliwatts(lib, lib.gpu_of(h))
    return OK


@symbol("nvmlDeviceGetPowerManagementLimitConstraints")
def power_limit_constraints(lib: Library, h: Any, lo: Any, hi: Any) -> int:
    out(lo).value = int(lib.model.power_limit_watts * 1000 * POWER_LIMIT_MIN_RATIO)
    out(hi).value = int(lib.model.power_limit_watts * 1000)
    return OK


@symbol("nvmlDeviceGetTotalEnergyConsumption")
def total_energy_consumption(lib: Library, h: Any, ref: Any) -> int:
    joules = lib.t.gpu_integral_of_product(lib.gpu_of(h), "power_ratio", "power_limit_watts")
    out(ref).value = int(joules * 1000)
    return OK


@symbol("nvmlDeviceGetTemperature")
def temperature(lib: Library, h: Any, sensor: Any, ref: Any) -> int:
    out(ref).value = round(lib.v(lib.gpu_of(h), "temp_c"))
    return OK


TEMPERATURE_V1 = 0x100000C  # nvmlTemperature_v1: NVML_STRUCT_VERSION(Temperature, 1), 12 bytes


@symbol("nvmlDeviceGetTemperatureV")
def temperature_v(lib: Library, h: Any, ref: Any) -> int:
    """CUDA 12.8's nvmlTemperature_v1_t {version, sensorType, temperature}; the older call is
    deprecated from CUDA 13.0."""
    t = out(ref)
    if t.version != TEMPERATURE_V1:
        return N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    if t.sensorType != N.NVML_TEMPERATURE_GPU:
        return N.NVML_ERROR_INVALID_ARGUMENT
    t.temperature = round(lib.v(lib.gpu_of(h), "temp_c"))
    return OK


@field(FI_MEMORY_TEMP)
def memory_temperature(lib: Library, g: int, fid: int, scope: int) -> float | None:
    return lib.v(g, "mem_temp_c")
