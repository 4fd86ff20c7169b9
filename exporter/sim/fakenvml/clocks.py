# mypy: disable-error-code="no-any-return"
"""The fake NVML library's clocks area: SM and memory clocks, the clock-event reasons
holding them down (mask and per-reason durations)."""

from __future__ import annotations

from typing import Any

import pynvml as N

from exporter.nvml import (
    FI_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
    FI_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    FI_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    FI_PERF_POLICY_POWER,
)
from exporter.sim.fakenvml.abi import OK, Library, field, out, symbol, val

# Timeline key -> the reason's bit: a reason is active while its key is 0.5 or more.
REASON_BITS = {
    "throttle_power_cap": N.nvmlClocksEventReasonSwPowerCap,
    "throttle_sw_thermal": N.nvmlClocksEventReasonSwThermalSlowdown,
    "throttle_hw_thermal": N.nvmlClocksEventReasonHwThermalSlowdown,
    "throttle_hw_slowdown": N.nvmlClocksEventReasonHwSlowdown,
    "throttle_power_brake": N.nvmlClocksEventReasonHwPowerBrakeSlowdown,
}
# Field id -> the timeline key whose integral is the time the reason held the clocks down.
REASON_FIELDS = {
    FI_PERF_POLICY_POWER: "throttle_power_cap",
    FI_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: "throttle_sw_thermal",
    FI_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: "throttle_hw_thermal",
    FI_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: "throttle_power_brake",
}


@symbol("nvmlDeviceGetMaxClockInfo")
def max_clock_info(lib: Library, h: Any, kind: Any, ref: Any) -> int:
    sm = val(kind) == N.NVML_CLOCK_SM
    hz = lib.model.sm_clock_max_hertz if sm else lib.model.memory_clock_max_hertz
    out(ref).value = int(hz / 1e6)
    return OK


@symbol("nvmlDeviceGetClockInfo")
def clock_info(lib: Library, h: Any, kind: Any, ref: Any) -> int:
    g = lib.gpu_of(h)
    if val(kind) == N.NVML_CLOCK_SM:
        hz = lib.model.sm_clock_max_hertz * min(1.0, lib.t.gpu(g, "sm_clock_ratio"))
    else:
        hz = lib.model.memory_clock_max_hertz * min(1.0, lib.t.gpu(g, "mem_clock_ratio"))
    out(ref).value = round(hz / 1e6)  # whole MHz, as the driver answers
    return OK


# The same mask under its pre-R535 name, exported by every branch.
@symbol("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
def clock_event_reasons(lib: Library, h: Any, ref: Any) -> int:
    g = lib.gpu_of(h)
    bits = 0
    for key, bit in REASON_BITS.items():
        if lib.t.gpu(g, key) >= 0.5:
            bits |= bit
    if lib.t.gpu(g, "util") < 0.01:
        bits |= N.nvmlClocksEventReasonGpuIdle
    out(ref).value = bits
    return OK


@field(*REASON_FIELDS)
def reason_nanoseconds(lib: Library, g: int, fid: int, scope: int) -> float | None:
    return lib.t.gpu_integral(g, REASON_FIELDS[fid]) * 1e9
