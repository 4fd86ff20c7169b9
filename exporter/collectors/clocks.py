"""SM and memory clocks, the clock-event (throttle) reasons active now and their durations."""

from __future__ import annotations

from typing import Any

from exporter.collectors.base import Context, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import Clocks
from exporter.nvml import (
    FI_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
    FI_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    FI_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
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


@register("clocks", "SM and memory clocks, clock-event (throttle) reasons and their durations", nvml=True)
def _clocks(ctx: Context) -> ClocksCollector:
    return ClocksCollector(ctx)
