"""SM and memory clocks, the clock-event (throttle) reasons active now and their durations.

The SW power cap and SW thermal durations are the perf-policy counters (fields 74 and
75, never renumbered). The HW thermal and HW power brake ones moved between releases
(exporter/nvml.py): they are read only where the driver's version says which ids they
have, and a field is a duration only while it behaves like one: it never falls and never
grows faster than the time that passed. One that does is dropped for that GPU, counted
as `NotADuration` and logged: a power-smoothing setting read under the wrong numbering
must not turn into seconds of throttling.
"""

from __future__ import annotations

import logging
from typing import Any

from exporter.collectors.base import Context, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import Clocks
from exporter.nvml import FI_PERF_POLICY_POWER, FI_PERF_POLICY_THERMAL, decode, function, hw_slowdown_fields
from exporter.nvml import const as N

log = logging.getLogger(__name__)

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
STABLE_FIELDS = {FI_PERF_POLICY_POWER: "sw_power_cap", FI_PERF_POLICY_THERMAL: "sw_thermal"}
# How much faster than the collector's clock a duration may seem to grow: the driver
# stamps its counters on its own clock, a little apart from ours.
GROWTH_SLACK_RATIO = 1.1
GROWTH_SLACK_S = 1.0


class ClocksCollector(GpuCollector):
    name = "clocks"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._fields: dict[int, str] | None = None  # field id -> reason, once the driver is known
        self._last: dict[tuple[int, str], tuple[float, float]] = {}  # (GPU, reason) -> (at, seconds)
        self._dropped: set[tuple[int, str]] = set()

    def _reason_fields(self) -> dict[int, str]:
        if self._fields is None:
            version = decode(self.query(N.nvmlSystemGetDriverVersion) or "")
            if not version:
                return STABLE_FIELDS  # asked again next run
            numbered = hw_slowdown_fields(version)
            if numbered is None:
                log.warning(
                    "driver %s: the ids of the HW thermal and HW power brake durations are not "
                    "known for it; those durations stay absent",
                    version,
                )
            self._fields = {**STABLE_FIELDS, **{fid: r for r, fid in (numbered or {}).items()}}
        return self._fields

    def _durations(
        self, index: int, reasons: dict[int, str], values: dict[tuple[int, int], float]
    ) -> dict[str, float] | None:
        now = self._clock()
        out = {}
        for (fid, _), ns in values.items():
            reason = reasons[fid]
            key = (index, reason)
            if key in self._dropped:
                continue
            seconds = ns / 1e9
            last = self._last.get(key)
            if last is not None and not self._like_a_duration(last, now, seconds):
                self._dropped.add(key)
                self._failed["NotADuration"] += 1
                log.warning(
                    "clocks: GPU %d's %s duration went from %.6f s to %.6f s in %.3f s; not a "
                    "duration, left out",
                    index,
                    reason,
                    last[1],
                    seconds,
                    now - last[0],
                )
                continue
            self._last[key] = (now, seconds)
            out[reason] = seconds
        return out or None

    @staticmethod
    def _like_a_duration(last: tuple[float, float], now: float, seconds: float) -> bool:
        grew, passed = seconds - last[1], max(0.0, now - last[0])
        return 0.0 <= grew <= passed * GROWTH_SLACK_RATIO + GROWTH_SLACK_S

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
        reasons = self._reason_fields()
        fields = self.field_values(h, [(fid, 0) for fid in reasons])
        return Clocks(
            sm_hertz=sm * 1e6 if sm is not None else None,
            memory_hertz=mem * 1e6 if mem is not None else None,
            event_active=None if bits is None else {r: int(bool(bits & b)) for b, r in REASONS.items()},
            event_seconds=self._durations(index, reasons, fields),
        )

    def forget(self, index: int) -> None:
        self._last = {k: v for k, v in self._last.items() if k[0] != index}
        self._dropped = {k for k in self._dropped if k[0] != index}

    def reset(self) -> None:
        super().reset()
        self._fields = None  # a reloaded driver may be another version: its ids are asked again


@register("clocks", "SM and memory clocks, clock-event (throttle) reasons and their durations", nvml=True)
def _clocks(ctx: Context) -> ClocksCollector:
    return ClocksCollector(ctx)
