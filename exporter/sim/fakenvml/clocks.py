# mypy: disable-error-code="no-any-return"
"""The fake NVML library's clocks area: SM and memory clocks, the clock-event reasons
holding them down (mask and per-reason durations), and the power-smoothing settings
that share the durations' field ids across releases (exporter/sim/drivers.py)."""

from __future__ import annotations

from typing import Any

import pynvml as N

from exporter.nvml import FI_PERF_POLICY_POWER, FI_PERF_POLICY_THERMAL
from exporter.sim.drivers import FI_SINCE_R570, FI_SINCE_R575
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
REASON_FIELDS = {FI_PERF_POLICY_POWER: "throttle_power_cap", FI_PERF_POLICY_THERMAL: "throttle_sw_thermal"}
# The durations whose ids depend on the release, in the order of Driver.clock_events.
NUMBERED_REASONS = ("throttle_sw_thermal", "throttle_hw_thermal", "throttle_power_brake")
# The 18 NVML_FI_PWR_SMOOTHING_* settings in header order: enabled, privilege level,
# immediate ramp-down, applied ceiling and floor (W), max and min floor (%), circuitry
# lifetime left (%), preset profiles, a profile's floor (%), ramp up and down (mW/s) and
# hysteresis (ms), the active profile, and the admin overrides of floor, ramp up, ramp
# down and hysteresis. nvml.h does not say which parts answer them; the fake answers on
# every part, the worst case for a reader that takes one for a duration.
POWER_SMOOTHING = (
    1,
    0,
    1,
    700,
    350,
    90,
    10,
    98,
    5,
    50,
    2_000_000,
    1_500_000,
    500,
    2,
    35,
    2_000_000,
    1_500_000,
    500,
)


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


@field(FI_SINCE_R570, FI_SINCE_R575)
def renumbered(lib: Library, g: int, fid: int, scope: int) -> float | None:
    """Ids 251-273, as this release numbers them: a duration, or a power-smoothing setting."""
    driver = lib.profile.driver
    if driver.clock_events is not None and fid in driver.clock_events:
        return lib.t.gpu_integral(g, NUMBERED_REASONS[driver.clock_events.index(fid)]) * 1e9
    start = driver.power_smoothing_from
    if start is not None and start <= fid < start + len(POWER_SMOOTHING):
        return float(POWER_SMOOTHING[fid - start])
    return None
