"""Fast-changing GPU state: busy time, memory, clocks and their throttle reasons, power, heat."""

from __future__ import annotations

from typing import Any

from exporter.collectors.base import Context, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import Clocks, Memory, Power, Utilization
from exporter.nvml import (
    FI_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
    FI_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    FI_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    FI_MEMORY_TEMP,
    FI_PERF_POLICY_POWER,
    function,
)
from exporter.nvml import const as N

# Clock-event reason bit -> label; GpuIdle is no throttle and stays out.
REASONS = {
    N.nvmlClocksEventReasonApplicationsClocksSetting: "applications_clocks",
    N.nvmlClocksEventReasonSwPowerCap: "sw_power_cap",
    N.nvmlClocksEventReasonHwSlowdown: "hw_slowdown",
    N.nvmlClocksEventReasonSyncBoost: "sync_boost",
    N.nvmlClocksEventReasonSwThermalSlowdown: "sw_thermal",
    N.nvmlClocksEventReasonHwThermalSlowdown: "hw_thermal",
    N.nvmlClocksEventReasonHwPowerBrakeSlowdown: "hw_power_brake",
}
# Cumulative held-down time per reason, in nanoseconds.
REASON_FIELDS = {
    (FI_PERF_POLICY_POWER, 0): "sw_power_cap",
    (FI_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN, 0): "sw_thermal",
    (FI_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN, 0): "hw_thermal",
    (FI_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN, 0): "hw_power_brake",
}
MEMORY_TEMP = (FI_MEMORY_TEMP, 0)
FIELDS = [*REASON_FIELDS, MEMORY_TEMP]


class UtilizationCollector(GpuCollector):
    name = "utilization"

    def read(self, index: int, h: Any) -> Utilization:
        u = self.query(N.nvmlDeviceGetUtilizationRates, h)
        if u is None:
            return Utilization()
        return Utilization(gpu_busy_ratio=u.gpu / 100, memory_busy_ratio=u.memory / 100)


class MemoryCollector(GpuCollector):
    name = "memory"

    def read(self, index: int, h: Any) -> Memory:
        m = self.query_versioned(
            "nvmlDeviceGetMemoryInfo",
            [
                lambda: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2),
                lambda: N.nvmlDeviceGetMemoryInfo(h),
            ],
        )
        bar1 = self.held(index, "bar1", lambda: self.query(N.nvmlDeviceGetBAR1MemoryInfo, h))
        return Memory(
            used_bytes=m.used if m is not None else None,
            free_bytes=m.free if m is not None else None,
            reserved_bytes=getattr(m, "reserved", None),
            bar1_used_bytes=bar1.bar1Used if bar1 is not None else None,
            bar1_total_bytes=bar1.bar1Total if bar1 is not None else None,
        )


class ClocksCollector(GpuCollector):
    name = "clocks"

    def read(self, index: int, h: Any) -> Clocks:
        q = self.query
        sm = q(N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_SM)
        mem = self.held(index, "memory", lambda: q(N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_MEM))
        # The same bit mask under its pre-R535 name: older drivers have only that symbol.
        bits = self.query_versioned(
            "nvmlDeviceGetCurrentClocksEventReasons",
            [
                lambda: function("nvmlDeviceGetCurrentClocksEventReasons")(h),
                lambda: function("nvmlDeviceGetCurrentClocksThrottleReasons")(h),
            ],
        )
        fields = self.field_values(h, list(REASON_FIELDS))
        return Clocks(
            sm_hertz=sm * 1e6 if sm is not None else None,
            memory_hertz=mem * 1e6 if mem is not None else None,
            event_active=None if bits is None else {r: int(bool(bits & b)) for b, r in REASONS.items()},
            event_seconds={REASON_FIELDS[k]: v / 1e9 for k, v in fields.items()} or None,
        )


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
            gpu_celsius=q(N.nvmlDeviceGetTemperature, h, N.NVML_TEMPERATURE_GPU),
            memory_celsius=mem_temp or None,  # 0 means the sensor is not wired
        )


@register("utilization", "NVML GPU and memory busy time", nvml=True)
def _utilization(ctx: Context) -> UtilizationCollector:
    return UtilizationCollector(ctx)


@register("memory", "Framebuffer used/free/reserved and BAR1", nvml=True)
def _memory(ctx: Context) -> MemoryCollector:
    return MemoryCollector(ctx)


@register("clocks", "SM and memory clocks, clock-event (throttle) reasons and their durations", nvml=True)
def _clocks(ctx: Context) -> ClocksCollector:
    return ClocksCollector(ctx)


@register("power", "Power draw, enforced limit, energy counter, GPU and HBM temperature", nvml=True)
def _power(ctx: Context) -> PowerCollector:
    return PowerCollector(ctx)
