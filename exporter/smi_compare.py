"""The comparison behind `selfcheck`: the exporter's readings against nvidia-smi's.

Identities, limits and sizes must agree at nvidia-smi's printed resolution; quantities
that move on their own pass when nvidia-smi's value lies between the exporter's two
samples, widened by the slack stated here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import psutil

from exporter import smi
from exporter.gpu_readings import Clocks, DeviceFacts, Ecc, Memory, Pcie, Power, Processes
from exporter.snapshot import GpuState, Snapshot

MIB = smi.MIB

# Slack for quantities that move between the exporter's reads and nvidia-smi's.
MEMORY_USED_SLACK_RATIO = 0.01  # of total memory ...
MEMORY_USED_SLACK_MIN = 256 * MIB  # ... or this, whichever is larger
POWER_DRAW_SLACK_RATIO = 0.10  # of the enforced power limit ...
POWER_DRAW_SLACK_MIN = 15.0  # ... or this many watts
TEMPERATURE_SLACK = 3.0  # degrees Celsius
CLOCK_SLACK_RATIO = 0.10  # of the maximum clock
RULES = {
    "memory used": "within 1 % of total memory or 256 MiB of the exporter's two samples",
    "power draw": "within 10 % of the power limit or 15 W of the exporter's two samples",
    "GPU temperature": "within 3 C of the exporter's two samples",
    "memory temperature": "within 3 C of the exporter's two samples",
    "SM clock": "within 10 % of the maximum clock of the exporter's two samples",
    "memory clock": "within 10 % of the maximum clock of the exporter's two samples",
    "memory total": "equal to nvidia-smi's 1 MiB resolution",
    "memory reserved": "equal to nvidia-smi's 1 MiB resolution",
    "power limit": "enforced and maximum limits equal to 0.01 W",
    "max clocks": "equal to 1 MHz",
    "name": "equal",
    "PCI bus id": "equal",
    "clock events": "the same throttle reasons active",
    "ECC corrected": "volatile counts equal",
    "ECC uncorrected": "volatile counts equal",
    "remapped rows": "counts and pending/failed flags equal",
    "PCIe link": "maximum generation and width, current width equal",
    "processes": "the same compute pids, memory per pid as for memory used",
    "GPM": "two samples gave GPM metrics",
    "field values": "nvmlDeviceGetFieldValues answers",
}
# Clock-event reasons the exporter exposes; idle and display clocks are no throttle.
THROTTLE_REASONS = frozenset(
    {"applications_clocks", "sw_power_cap", "hw_slowdown", "sync_boost", "sw_thermal", "hw_thermal"}
    | {"hw_power_brake"}
)

Status = Literal["pass", "fail", "warn", "skip"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str = ""
    gpu: int | None = None  # None: about the node


def _mib(v: float) -> str:
    return f"{v / MIB:.0f} MiB"


def _watts(v: float) -> str:
    return f"{v:.2f} W"


def _mhz(v: float) -> str:
    return f"{v / 1e6:.0f} MHz"


def _celsius(v: float) -> str:
    return f"{v:.0f} C"


def _gpu_readings(g: GpuState | None, cls: type[Any]) -> Any:
    return None if g is None else g.get(cls)


class Comparer:
    """Checks for one GPU: the exporter's two samples against nvidia-smi's reading."""

    def __init__(self, index: int, first: GpuState | None, second: GpuState, theirs: smi.SmiGpu) -> None:
        self.index = index
        self.first = first
        self.second = second
        self.theirs = theirs
        self.checks: list[Check] = []

    def add(self, name: str, status: Status, detail: str = "") -> None:
        self.checks.append(Check(name, status, detail, self.index))

    def ours(self, cls: type[Any], attr: str) -> list[float]:
        """This field in both samples, the ones that have it."""
        values = [getattr(_gpu_readings(g, cls), attr, None) for g in (self.first, self.second)]
        return [float(v) for v in values if v is not None]

    def absent(self, name: str, ours: object, theirs: object, what: str) -> bool:
        """Record the check when one side lacks the value; True when it was recorded."""
        if ours is None and theirs is None:
            self.add(name, "skip", f"neither reports {what}")
        elif ours is None:
            self.add(name, "fail", f"nvidia-smi reports {what}, the exporter has none")
        elif theirs is None:
            self.add(name, "skip", f"nvidia-smi does not report {what}")
        else:
            return False
        return True

    def exact(
        self, name: str, ours: float | None, theirs: float | None, tol: float, fmt: Callable[[float], str]
    ) -> None:
        if self.absent(name, ours, theirs, name):
            return
        assert ours is not None and theirs is not None
        status: Status = "pass" if abs(ours - theirs) <= tol else "fail"
        self.add(name, status, f"exporter {fmt(ours)}, nvidia-smi {fmt(theirs)}")

    def within(
        self, name: str, ours: list[float], theirs: float | None, slack: float, fmt: Callable[[float], str]
    ) -> None:
        if self.absent(name, ours or None, theirs, name):
            return
        assert theirs is not None
        lo, hi = min(ours), max(ours)
        seen = fmt(lo) if lo == hi else f"{fmt(lo)}..{fmt(hi)}"
        status: Status = "pass" if lo - slack <= theirs <= hi + slack else "fail"
        self.add(name, status, f"exporter {seen}, nvidia-smi {fmt(theirs)} (slack {fmt(slack)})")

    def run(self, processes: tuple[smi.SmiProcess, ...] | None) -> list[Check]:
        t, g = self.theirs, self.second
        facts = g.facts or DeviceFacts()
        if not g.up:
            self.add("GPU up", "fail", "the exporter could not read this GPU (llmgpu_gpu_up 0)")
        self.exact_text("name", facts.get("name"), t.name)
        self.exact_text("PCI bus id", facts.get("pci_bus_id").upper(), t.pci_bus_id.upper())
        self.memory()
        self.power()
        clock_max = facts.sm_clock_max_hertz or t.sm_clock_max_hertz or 0.0
        mem_max = facts.memory_clock_max_hertz or t.memory_clock_max_hertz or 0.0
        self.within(
            "SM clock", self.ours(Clocks, "sm_hertz"), t.sm_clock_hertz, CLOCK_SLACK_RATIO * clock_max, _mhz
        )
        self.within(
            "memory clock",
            self.ours(Clocks, "memory_hertz"),
            t.memory_clock_hertz,
            CLOCK_SLACK_RATIO * mem_max,
            _mhz,
        )
        self.max_clocks(facts)
        self.within(
            "GPU temperature", self.ours(Power, "gpu_celsius"), t.gpu_celsius, TEMPERATURE_SLACK, _celsius
        )
        self.within(
            "memory temperature",
            self.ours(Power, "memory_celsius"),
            t.memory_celsius,
            TEMPERATURE_SLACK,
            _celsius,
        )
        self.clock_events()
        self.ecc()
        self.pcie(facts)
        self.processes(processes)
        return self.checks

    def exact_text(self, name: str, ours: str, theirs: str) -> None:
        if not ours and not theirs:
            self.add(name, "skip", f"neither reports the {name}")
            return
        self.add(name, "pass" if ours == theirs else "fail", f"exporter {ours!r}, nvidia-smi {theirs!r}")

    def memory(self) -> None:
        t, facts = self.theirs, self.second.facts or DeviceFacts()
        self.exact("memory total", facts.memory_total_bytes, t.memory_total_bytes, MIB - 1, _mib)
        total = facts.memory_total_bytes or t.memory_total_bytes or 0
        slack = max(MEMORY_USED_SLACK_MIN, MEMORY_USED_SLACK_RATIO * total)
        used = self.ours(Memory, "used_bytes")
        reserved = self.ours(Memory, "reserved_bytes")
        if t.memory_reserved_bytes is None and reserved:
            # Older drivers print reserved memory as used (the v1 memory info).
            used = [u + reserved[-1] for u in used]
        self.within("memory used", used, t.memory_used_bytes, slack, _mib)
        if t.memory_reserved_bytes is not None:
            ours = reserved[-1] if reserved else None
            self.exact("memory reserved", ours, t.memory_reserved_bytes, MIB - 1, _mib)

    def power(self) -> None:
        t, facts = self.theirs, self.second.facts or DeviceFacts()
        limits = self.ours(Power, "limit_watts")
        limit = limits[-1] if limits else None
        if not self.absent("power limit", limit, t.power_limit_watts, "an enforced power limit"):
            assert limit is not None and t.power_limit_watts is not None
            ok = abs(limit - t.power_limit_watts) <= 0.01
            top, their_top = facts.power_limit_max_watts, t.power_limit_max_watts
            if top is not None and their_top is not None:
                ok = ok and abs(top - their_top) <= 0.01
            detail = f"enforced: exporter {_watts(limit)}, nvidia-smi {_watts(t.power_limit_watts)}"
            if top is not None and their_top is not None:
                detail += f"; max: exporter {_watts(top)}, nvidia-smi {_watts(their_top)}"
            self.add("power limit", "pass" if ok else "fail", detail)
        basis = limit or t.power_limit_watts or 0.0
        slack = max(POWER_DRAW_SLACK_MIN, POWER_DRAW_SLACK_RATIO * basis)
        self.within("power draw", self.ours(Power, "usage_watts"), t.power_draw_watts, slack, _watts)

    def max_clocks(self, facts: DeviceFacts) -> None:
        t = self.theirs
        pairs = [
            (facts.sm_clock_max_hertz, t.sm_clock_max_hertz, "SM"),
            (facts.memory_clock_max_hertz, t.memory_clock_max_hertz, "memory"),
        ]
        known = [(a, b, n) for a, b, n in pairs if a is not None and b is not None]
        missing = [n for a, b, n in pairs if a is None and b is not None]
        if missing:
            self.add(
                "max clocks",
                "fail",
                f"nvidia-smi reports a maximum {' and '.join(missing)} clock, the exporter has none",
            )
            return
        if not known:
            self.add("max clocks", "skip", "no maximum clocks on both sides")
            return
        ok = all(abs(a - b) <= 1e6 for a, b, _ in known)
        detail = "; ".join(f"{n}: exporter {_mhz(a)}, nvidia-smi {_mhz(b)}" for a, b, n in known)
        self.add("max clocks", "pass" if ok else "fail", detail)

    def clock_events(self) -> None:
        clocks = self.second.get(Clocks)
        ours_map = clocks.event_active if clocks else None
        theirs = self.theirs.clock_events_active
        if self.absent("clock events", ours_map, theirs, "clock-event reasons"):
            return
        assert ours_map is not None and theirs is not None
        ours = {r for r, on in ours_map.items() if on}
        theirs = theirs & THROTTLE_REASONS
        if ours == theirs:
            self.add("clock events", "pass", f"active: {', '.join(sorted(ours)) or 'none'}")
        else:  # reasons come and go within milliseconds under load: worth a look, no failure
            self.add(
                "clock events",
                "warn",
                f"exporter {sorted(ours) or 'none'}, nvidia-smi {sorted(theirs) or 'none'} "
                "(they flip quickly under load; rerun if this persists)",
            )

    def counter(self, name: str, ours: int | None, theirs: int | None) -> None:
        if self.absent(name, ours, theirs, name):
            return
        assert ours is not None and theirs is not None
        if ours == theirs:
            self.add(name, "pass", f"{ours} in both")
        elif theirs > ours:  # nvidia-smi read last; a counter only grows
            self.add(name, "warn", f"exporter {ours}, nvidia-smi {theirs}: errors are accruing right now")
        else:
            self.add(name, "fail", f"exporter {ours}, nvidia-smi {theirs}")

    def ecc(self) -> None:
        t, ecc = self.theirs, self.second.get(Ecc)
        self.counter("ECC corrected", ecc.corrected if ecc else None, t.ecc_corrected)
        self.counter("ECC uncorrected", ecc.uncorrected if ecc else None, t.ecc_uncorrected)
        rows = ecc.remapped_rows if ecc else None
        ours = None if rows is None else (rows.get("correctable"), rows.get("uncorrectable"))
        ours_flags = (
            None if ecc is None or ecc.remap_pending is None else (ecc.remap_pending, ecc.remap_failed)
        )
        theirs = (
            None
            if t.remapped_rows_correctable is None
            else (t.remapped_rows_correctable, t.remapped_rows_uncorrectable)
        )
        if self.absent("remapped rows", ours, theirs, "remapped rows"):
            return
        their_flags = (int(bool(t.remap_pending)), int(bool(t.remap_failed)))
        ok = ours == theirs and (ours_flags is None or ours_flags == their_flags)
        self.add(
            "remapped rows",
            "pass" if ok else "fail",
            f"correctable/uncorrectable: exporter {ours}, nvidia-smi {theirs}; "
            f"pending/failed: exporter {ours_flags}, nvidia-smi {their_flags}",
        )

    def pcie(self, facts: DeviceFacts) -> None:
        t, link = self.theirs, self.second.get(Pcie)
        ours = (facts.pcie_link_generation_max, facts.pcie_link_width_max, link.link_width if link else None)
        theirs = (t.pcie_generation_max, t.pcie_width_max, t.pcie_width)
        if self.absent(
            "PCIe link", ours if any(v is not None for v in ours) else None, t.pcie_width_max, "a PCIe link"
        ):
            return
        gen = link.link_generation if link else None
        detail = (
            f"max gen/width: exporter {ours[0]}/x{ours[1]}, nvidia-smi {theirs[0]}/x{theirs[1]}; "
            f"current gen/width: exporter {gen}/x{ours[2]}, nvidia-smi {t.pcie_generation}/x{t.pcie_width}"
        )
        if ours != theirs:
            self.add("PCIe link", "fail", detail)
        elif gen != t.pcie_generation:  # an idle link trains down and back up
            self.add("PCIe link", "warn", detail + " (the current generation drops while idle)")
        else:
            self.add("PCIe link", "pass", detail)

    def processes(self, theirs_all: tuple[smi.SmiProcess, ...] | None) -> None:
        ours_reading = self.second.get(Processes)
        theirs = None if theirs_all is None else [p for p in theirs_all if p.compute]
        ours = None if ours_reading is None or ours_reading.count is None else ours_reading.items
        if ours is None and theirs is not None and not theirs:
            ours = ()  # no reading because no process: both agree there is none
        if self.absent("processes", ours, theirs, "compute processes"):
            return
        assert ours is not None and theirs is not None
        mine = {p.pid: p.used_bytes for p in ours}
        other = {p.pid: p.used_memory_bytes for p in theirs}
        if mine and not other and not any(psutil.pid_exists(pid) for pid in mine):
            # Pids that exist nowhere here (the simulator's): NVML and nvidia-smi both get
            # the driver's list translated into the caller's PID namespace, so on a real
            # node they see the same processes.
            self.add(
                "processes",
                "warn",
                f"the exporter sees pids {sorted(mine)}, nvidia-smi none: none of them is visible from "
                "here (a container without the host's PID namespace?), so this cannot be compared",
            )
            return
        problems = []
        if only := sorted(set(other) - set(mine)):
            problems.append(f"seen only by nvidia-smi: {only}")
        if only := sorted(set(mine) - set(other)):
            problems.append(f"seen only by the exporter: {only}")
        total = (self.second.facts or DeviceFacts()).memory_total_bytes or 0
        slack = max(MEMORY_USED_SLACK_MIN, MEMORY_USED_SLACK_RATIO * total)
        for pid in sorted(set(mine) & set(other)):
            a, b = mine[pid], other[pid]
            if a is not None and b is not None and abs(a - b) > slack:
                problems.append(f"pid {pid} uses {_mib(a)} by the exporter, {_mib(b)} by nvidia-smi")
        if problems:
            self.add("processes", "fail", "; ".join(problems))
        else:
            self.add("processes", "pass", f"{len(mine)} compute process(es): {sorted(mine) or 'none'}")


def compare(
    first: Snapshot, second: Snapshot, log: smi.SmiLog, processes: tuple[smi.SmiProcess, ...] | None
) -> list[Check]:
    """Every check that needs nvidia-smi's answer."""
    checks: list[Check] = []
    ours = {g.uuid: g for g in second.gpus}
    theirs = {g.uuid: g for g in log.gpus}
    status: Status = "pass" if len(second.gpus) == len(log.gpus) else "fail"
    checks.append(Check("GPU count", status, f"exporter {len(second.gpus)}, nvidia-smi {len(log.gpus)}"))
    missing, extra = sorted(set(theirs) - set(ours)), sorted(set(ours) - set(theirs))
    if missing or extra:
        parts = [f"not seen by the exporter: {', '.join(missing)}"] if missing else []
        parts += [f"not listed by nvidia-smi: {', '.join(extra)}"] if extra else []
        checks.append(Check("GPU UUIDs", "fail", "; ".join(parts)))
    else:
        checks.append(Check("GPU UUIDs", "pass", f"{len(ours)} in both"))
    drivers = {(g.facts or DeviceFacts()).get("driver_version") for g in second.gpus} - {""}
    driver = next(iter(drivers)) if len(drivers) == 1 else ", ".join(sorted(drivers))
    status = "pass" if driver == (log.driver_version or "") else "fail"
    checks.append(Check("driver version", status, f"exporter {driver!r}, nvidia-smi {log.driver_version!r}"))
    by_uuid: dict[str, list[smi.SmiProcess]] = {}
    if processes is not None:
        for p in processes:
            by_uuid.setdefault(p.gpu_uuid, []).append(p)
    for g in second.gpus:
        t = theirs.get(g.uuid)
        if t is None:
            continue
        procs = tuple(by_uuid.get(g.uuid, ())) if processes is not None else t.processes
        checks.extend(Comparer(g.index, first.gpu(g.index), g, t).run(procs))
    return checks


# ---- NVML paths nvidia-smi does not take --------------------------------------------------
