"""nvidia-smi's own view of the GPUs: its XML (`-q -x`) and CSV (`--query-*`) outputs, parsed.

`selfcheck` compares these with the exporter's NVML readings. Values come out in the
exporter's base units (bytes, watts, hertz, degrees Celsius); a value nvidia-smi prints as
"N/A", "[N/A]", "Not Supported" or any other bracketed remark is `None`. The XML schema
changed over driver releases (power under `power_readings` before 535 and
`gpu_power_readings` since, clock "throttle" reasons renamed "event" reasons, ECC counters
split by memory kind); both shapes are read.
"""

from __future__ import annotations

import csv
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Final

MIB: Final = 1024 * 1024
_UNITS: Final[dict[str, float]] = {
    "b": 1,
    "kib": 1024,
    "mib": MIB,
    "gib": 1024 * MIB,
    "w": 1,
    "mw": 1e-3,
    "hz": 1,
    "khz": 1e3,
    "mhz": 1e6,
    "ghz": 1e9,
    "c": 1,
    "%": 1,
    "x": 1,  # PCIe link width, "16x"
    "us": 1,
}
_QUANTITY = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([a-zA-Z%]*)\s*$")
_BARE = re.compile(r"-?\d+(?:\.\d+)?")
_ABSENT = {"", "n/a", "not supported", "unknown error", "none"}

# nvidia-smi's clock-event (throttle) reason names -> the exporter's `reason` labels.
CLOCK_EVENTS: Final[dict[str, str]] = {
    "gpu_idle": "gpu_idle",
    "applications_clocks_setting": "applications_clocks",
    "sw_power_cap": "sw_power_cap",
    "hw_slowdown": "hw_slowdown",
    "hw_thermal_slowdown": "hw_thermal",
    "hw_power_brake_slowdown": "hw_power_brake",
    "sync_boost": "sync_boost",
    "sw_thermal_slowdown": "sw_thermal",
    "display_clocks_setting": "display_clocks",
}
# Bits of clocks_event_reasons.active (nvmlClocksEventReason*).
_EVENT_BITS: Final[dict[int, str]] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}


class SmiError(ValueError):
    """nvidia-smi output that cannot be read; the message says what is wrong."""


@dataclass(frozen=True)
class SmiProcess:
    pid: int
    used_memory_bytes: int | None = None
    name: str = ""
    type: str = ""  # "C" compute, "G" graphics, "C+G"; empty when not reported
    gpu_uuid: str = ""

    @property
    def compute(self) -> bool:
        return self.type in ("", "C", "C+G")


@dataclass(frozen=True)
class SmiMigDevice:
    """One MIG device of a GPU, as `-q -x` lists it under mig_devices."""

    multiprocessors: int
    memory_total_bytes: int


@dataclass(frozen=True)
class SmiGpu:
    name: str
    uuid: str
    pci_bus_id: str
    architecture: str | None = None
    mig_enabled: bool | None = None
    gpu_busy_ratio: float | None = None  # utilization.gpu, 0-1 (N/A with MIG on)
    memory_busy_ratio: float | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None  # None on drivers that count it in `used`
    power_draw_watts: float | None = None  # the 1 s average where the driver reports one
    power_draw_instant_watts: float | None = None
    power_limit_watts: float | None = None  # enforced
    power_limit_max_watts: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    sm_clock_max_hertz: float | None = None
    memory_clock_max_hertz: float | None = None
    gpu_celsius: float | None = None
    memory_celsius: float | None = None
    clock_events_active: frozenset[str] | None = None  # exporter reason labels, gpu_idle included
    ecc_corrected: int | None = None  # volatile, all memory kinds
    ecc_uncorrected: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    pcie_generation: int | None = None
    pcie_generation_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    processes: tuple[SmiProcess, ...] | None = None  # None: this output does not list them
    mig_devices: tuple[SmiMigDevice, ...] = ()


@dataclass(frozen=True)
class SmiLog:
    driver_version: str | None
    cuda_version: str | None
    gpus: tuple[SmiGpu, ...]

    def gpu(self, uuid: str) -> SmiGpu | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


# ---- values ------------------------------------------------------------------------------


def _absent(text: str | None) -> bool:
    if text is None:
        return True
    t = text.strip()
    return t.lower() in _ABSENT or (t.startswith("[") and t.endswith("]"))


def text_value(text: str | None) -> str | None:
    return None if _absent(text) else " ".join((text or "").split())


def quantity(text: str | None, unit: str, default_unit: str | None = None) -> float | None:
    """'81559 MiB' read in `unit` ('b', 'w', 'hz', 'c', 'x'); a bare number is in `default_unit`."""
    if _absent(text):
        return None
    m = _QUANTITY.match(text or "")
    if m is None:
        raise SmiError(f"expected a number, got {text!r}")
    number, given = float(m.group(1)), (m.group(2).lower() or default_unit or unit)
    if given not in _UNITS:
        raise SmiError(f"unknown unit {m.group(2)!r} in {text!r}")
    return number * _UNITS[given] / _UNITS[unit]


def _bytes(text: str | None, default_unit: str = "mib") -> int | None:
    v = quantity(text, "b", default_unit)
    return None if v is None else round(v)


def _ratio(text: str | None) -> float | None:
    """'37 %' as 0.37."""
    v = quantity(text, "%", "%")
    return None if v is None else v / 100


def _int(text: str | None) -> int | None:
    v = quantity(text, "x")
    return None if v is None else round(v)


def _yes(text: str | None) -> bool | None:
    t = text_value(text)
    if t is None:
        return None
    return t.lower() in ("yes", "enabled", "active")


# ---- XML -----------------------------------------------------------------------------------


def parse_xml(data: str | bytes) -> SmiLog:
    """`nvidia-smi -q -x` output. The DTD it may embed is never loaded."""
    try:
        root = ET.fromstring(data)
    except ET.ParseError as err:
        raise SmiError(f"nvidia-smi XML does not parse: {err}") from err
    if root.tag != "nvidia_smi_log":
        raise SmiError(f"not nvidia-smi -q -x output: the root element is <{root.tag}>")
    gpus = []
    for node in root.findall("gpu"):
        try:
            gpus.append(_xml_gpu(node))
        except SmiError as err:
            raise SmiError(f"GPU {node.get('id', '?')}: {err}") from err
    return SmiLog(
        driver_version=text_value(root.findtext("driver_version")),
        cuda_version=text_value(root.findtext("cuda_version")),
        gpus=tuple(gpus),
    )


def _first(node: ET.Element, *paths: str) -> str | None:
    """The first of the paths that is present and not N/A (schemas renamed fields)."""
    for path in paths:
        found = node.findtext(path)
        if not _absent(found):
            return found
    return None


def _xml_gpu(g: ET.Element) -> SmiGpu:
    link = "pci/pci_gpu_link_info/"
    power = g.find("gpu_power_readings")
    if power is None:
        power = g.find("power_readings")
    p = power if power is not None else ET.Element("none")
    return SmiGpu(
        name=text_value(g.findtext("product_name")) or "",
        uuid=text_value(g.findtext("uuid")) or "",
        pci_bus_id=text_value(g.findtext("pci/pci_bus_id")) or g.get("id") or "",
        architecture=text_value(g.findtext("product_architecture")),
        mig_enabled=_yes(g.findtext("mig_mode/current_mig")),
        gpu_busy_ratio=_ratio(g.findtext("utilization/gpu_util")),
        memory_busy_ratio=_ratio(g.findtext("utilization/memory_util")),
        memory_total_bytes=_bytes(g.findtext("fb_memory_usage/total")),
        memory_used_bytes=_bytes(g.findtext("fb_memory_usage/used")),
        memory_free_bytes=_bytes(g.findtext("fb_memory_usage/free")),
        memory_reserved_bytes=_bytes(g.findtext("fb_memory_usage/reserved")),
        power_draw_watts=quantity(_first(p, "average_power_draw", "power_draw", "instant_power_draw"), "w"),
        power_draw_instant_watts=quantity(p.findtext("instant_power_draw"), "w"),
        power_limit_watts=quantity(_first(p, "current_power_limit", "enforced_power_limit"), "w"),
        power_limit_max_watts=quantity(p.findtext("max_power_limit"), "w"),
        sm_clock_hertz=quantity(g.findtext("clocks/sm_clock"), "hz", "mhz"),
        memory_clock_hertz=quantity(g.findtext("clocks/mem_clock"), "hz", "mhz"),
        sm_clock_max_hertz=quantity(g.findtext("max_clocks/sm_clock"), "hz", "mhz"),
        memory_clock_max_hertz=quantity(g.findtext("max_clocks/mem_clock"), "hz", "mhz"),
        gpu_celsius=quantity(g.findtext("temperature/gpu_temp"), "c"),
        memory_celsius=quantity(g.findtext("temperature/memory_temp"), "c"),
        clock_events_active=_xml_clock_events(g),
        ecc_corrected=_xml_ecc(g, corrected=True),
        ecc_uncorrected=_xml_ecc(g, corrected=False),
        remapped_rows_correctable=_int(g.findtext("remapped_rows/remapped_row_corr")),
        remapped_rows_uncorrectable=_int(g.findtext("remapped_rows/remapped_row_unc")),
        remap_pending=_yes(g.findtext("remapped_rows/remapped_row_pending")),
        remap_failed=_yes(g.findtext("remapped_rows/remapped_row_failure")),
        pcie_generation=_int(g.findtext(link + "pcie_gen/current_link_gen")),
        pcie_generation_max=_int(g.findtext(link + "pcie_gen/max_link_gen")),
        pcie_width=_int(g.findtext(link + "link_widths/current_link_width")),
        pcie_width_max=_int(g.findtext(link + "link_widths/max_link_width")),
        processes=_xml_processes(g),
        mig_devices=_xml_mig_devices(g),
    )


def _xml_mig_devices(g: ET.Element) -> tuple[SmiMigDevice, ...]:
    out = []
    for d in g.findall("mig_devices/mig_device"):
        sms = _int(d.findtext("device_attributes/shared/multiprocessor_count"))
        total = _bytes(d.findtext("fb_memory_usage/total"))
        if sms is not None and total is not None:
            out.append(SmiMigDevice(multiprocessors=sms, memory_total_bytes=total))
    return tuple(out)


def _xml_clock_events(g: ET.Element) -> frozenset[str] | None:
    for section, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        node = g.find(section)
        if node is None:
            continue
        active = set()
        seen = False
        for child in node:
            reason = CLOCK_EVENTS.get(child.tag.removeprefix(prefix))
            state = _yes(child.text)
            if reason is None or state is None:
                continue
            seen = True
            if state:
                active.add(reason)
        return frozenset(active) if seen else None
    return None


def _xml_ecc(g: ET.Element, corrected: bool) -> int | None:
    """Volatile total over memory kinds: what nvmlDeviceGetTotalEccErrors(VOLATILE) counts."""
    volatile = g.find("ecc_errors/volatile")
    if volatile is None:
        return None
    if volatile.find("single_bit") is not None:  # drivers before ~450: per-location tables
        return _int(volatile.findtext("single_bit/total" if corrected else "double_bit/total"))
    names: tuple[str, ...] = ("sram_correctable", "dram_correctable")
    if not corrected:  # sram_uncorrectable was split into parity and SEC-DED counts in 550
        names = ("sram_uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded")
        names = (*names, "dram_uncorrectable")
    values = [v for v in (_int(volatile.findtext(n)) for n in names) if v is not None]
    return sum(values) if values else None


def _xml_processes(g: ET.Element) -> tuple[SmiProcess, ...] | None:
    node = g.find("processes")
    if node is None:
        return None
    uuid = text_value(g.findtext("uuid")) or ""
    out = []
    for p in node.findall("process_info"):
        pid = _int(p.findtext("pid"))
        if pid is None:
            continue
        out.append(
            SmiProcess(
                pid=pid,
                used_memory_bytes=_bytes(p.findtext("used_memory")),
                name=text_value(p.findtext("process_name")) or "",
                type=text_value(p.findtext("type")) or "",
                gpu_uuid=uuid,
            )
        )
    return tuple(out)


# ---- CSV -----------------------------------------------------------------------------------


def _csv_rows(text: str, fields: list[str] | None) -> list[dict[str, str]]:
    """Rows keyed by field name; the header (if any) also gives each column's unit.

    Lines starting with '#' are skipped (nvidia-smi never prints one; recorded fixtures
    carry their source that way). A column's unit from the header, "memory.total [MiB]",
    is appended to bare values (nounits) so every value carries its unit.
    """
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    rows = list(csv.reader(lines, skipinitialspace=True))
    units: list[str] = []
    if fields is None:
        if not rows:
            raise SmiError("nvidia-smi CSV is empty: no header line")
        header, rows = rows[0], rows[1:]
        fields, units = [], []
        for column in header:
            m = re.match(r"^\s*(\S+)\s*(?:\[(.+)\])?\s*$", column)
            if m is None:
                raise SmiError(f"unreadable nvidia-smi CSV header column {column!r}")
            fields.append(m.group(1))
            units.append(m.group(2) or "")
    out = []
    for number, row in enumerate(rows, 1):
        if len(row) != len(fields):
            raise SmiError(f"nvidia-smi CSV row {number} has {len(row)} values for {len(fields)} fields")
        values = {}
        for i, (name, value) in enumerate(zip(fields, row, strict=True)):
            value = value.strip()
            unit = units[i] if i < len(units) else ""
            if unit and _BARE.fullmatch(value):
                value = f"{value} {unit}"
            values[name] = value
        out.append(values)
    return out


def _active_bits(text: str | None) -> frozenset[str] | None:
    if _absent(text):
        return None
    try:
        bits = int(text or "", 16)
    except ValueError as err:
        raise SmiError(f"clock event bitmask {text!r} is not hexadecimal") from err
    return frozenset(reason for bit, reason in _EVENT_BITS.items() if bits & bit)


def parse_query_gpu_csv(text: str) -> SmiLog:
    """`nvidia-smi --query-gpu=... --format=csv` (with its header; nounits is fine).

    Reads the fields it knows from whatever was queried; the others stay None.
    """
    gpus = []
    drivers = set()
    for r in _csv_rows(text, None):

        def get(*names: str, row: dict[str, str] = r) -> str | None:
            return next((row[n] for n in names if n in row and not _absent(row[n])), None)

        if "uuid" not in r:
            raise SmiError("nvidia-smi CSV lacks the uuid field, which identifies each GPU")
        drivers.add(get("driver_version"))
        gpus.append(
            SmiGpu(
                name=text_value(get("name", "gpu_name")) or "",
                uuid=text_value(get("uuid", "gpu_uuid")) or "",
                pci_bus_id=text_value(get("pci.bus_id", "gpu_bus_id")) or "",
                mig_enabled=_yes(get("mig.mode.current")),
                gpu_busy_ratio=_ratio(get("utilization.gpu")),
                memory_busy_ratio=_ratio(get("utilization.memory")),
                memory_total_bytes=_bytes(get("memory.total")),
                memory_used_bytes=_bytes(get("memory.used")),
                memory_free_bytes=_bytes(get("memory.free")),
                memory_reserved_bytes=_bytes(get("memory.reserved")),
                power_draw_watts=quantity(get("power.draw.average", "power.draw"), "w", "w"),
                power_draw_instant_watts=quantity(get("power.draw.instant"), "w", "w"),
                power_limit_watts=quantity(get("enforced.power.limit"), "w", "w"),
                power_limit_max_watts=quantity(get("power.max_limit"), "w", "w"),
                sm_clock_hertz=quantity(get("clocks.current.sm", "clocks.sm"), "hz", "mhz"),
                memory_clock_hertz=quantity(get("clocks.current.memory", "clocks.mem"), "hz", "mhz"),
                sm_clock_max_hertz=quantity(get("clocks.max.sm", "clocks.max.sm_clock"), "hz", "mhz"),
                memory_clock_max_hertz=quantity(
                    get("clocks.max.memory", "clocks.max.memory_clock"), "hz", "mhz"
                ),
                gpu_celsius=quantity(get("temperature.gpu"), "c", "c"),
                memory_celsius=quantity(get("temperature.memory"), "c", "c"),
                clock_events_active=_active_bits(
                    get("clocks_event_reasons.active", "clocks_throttle_reasons.active")
                ),
                ecc_corrected=_int(get("ecc.errors.corrected.volatile.total")),
                ecc_uncorrected=_int(get("ecc.errors.uncorrected.volatile.total")),
                remapped_rows_correctable=_int(get("remapped_rows.correctable")),
                remapped_rows_uncorrectable=_int(get("remapped_rows.uncorrectable")),
                remap_pending=_yes(get("remapped_rows.pending")),
                remap_failed=_yes(get("remapped_rows.failure")),
                pcie_generation=_int(get("pcie.link.gen.current")),
                pcie_generation_max=_int(get("pcie.link.gen.max")),
                pcie_width=_int(get("pcie.link.width.current")),
                pcie_width_max=_int(get("pcie.link.width.max")),
            )
        )
    drivers.discard(None)
    return SmiLog(
        driver_version=drivers.pop() if len(drivers) == 1 else None, cuda_version=None, gpus=tuple(gpus)
    )


COMPUTE_APPS_FIELDS: Final = ("gpu_uuid", "pid", "used_memory")


def parse_compute_apps_csv(text: str, fields: tuple[str, ...] | None = None) -> tuple[SmiProcess, ...]:
    """`nvidia-smi --query-compute-apps=... --format=csv[,noheader][,nounits]`.

    Without a header, `fields` names the queried columns in order; bare numbers for
    used_memory (nounits) are MiB, the unit nvidia-smi reports it in.
    """
    out = []
    for r in _csv_rows(text, list(fields) if fields is not None else None):
        pid = _int(r.get("pid"))
        if pid is None:
            raise SmiError(f"a compute process without a pid: {r}")
        out.append(
            SmiProcess(
                pid=pid,
                used_memory_bytes=_bytes(r.get("used_memory", r.get("used_gpu_memory"))),
                name=text_value(r.get("process_name", r.get("name"))) or "",
                gpu_uuid=text_value(r.get("gpu_uuid")) or "",
            )
        )
    return tuple(out)
