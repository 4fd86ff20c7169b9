"""Power draw, the enforced limit, the energy counter, GPU and HBM temperature.

The die temperature is read with nvmlDeviceGetTemperatureV where the driver (R570, CUDA
12.8) and the binding (12.570) have it: nvmlDeviceGetTemperature is deprecated from CUDA
13.0's nvml.h. Older drivers and bindings answer FunctionNotFound and the old call is used.
"""

from __future__ import annotations

from typing import Any

from exporter.collectors.base import Context, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import Power
from exporter.nvml import FI_MEMORY_TEMP, function
from exporter.nvml import const as N

MEMORY_TEMP = (FI_MEMORY_TEMP, 0)


class PowerCollector(GpuCollector):
    name = "power"

    def read(self, index: int, h: Any) -> Power:
        q = self.query
        usage = q(N.nvmlDeviceGetPowerUsage, h)
        limit = self.held(index, "limit", lambda: q(N.nvmlDeviceGetEnforcedPowerLimit, h))
        energy = q(N.nvmlDeviceGetTotalEnergyConsumption, h)
        mem_temp = self.field_values(h, [MEMORY_TEMP]).get(MEMORY_TEMP)
        return Power(
            usage_watts=usage / 1000 if usage is not None else None,
            limit_watts=limit / 1000 if limit is not None else None,
            energy_joules=energy / 1000 if energy is not None else None,
            gpu_celsius=self.query_versioned(
                "nvmlDeviceGetTemperature",
                [
                    lambda: function("nvmlDeviceGetTemperatureV")(h, N.NVML_TEMPERATURE_GPU),
                    lambda: N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU),
                ],
            ),
            memory_celsius=mem_temp or None,  # 0 means the sensor is not wired
        )


@register("power", "Power draw, enforced limit, energy counter, GPU and HBM temperature", nvml=True)
def _power(ctx: Context) -> PowerCollector:
    return PowerCollector(ctx)
