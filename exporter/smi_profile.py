"""A simulator scenario that reproduces what nvidia-smi recorded on real GPUs.

`scenario_of(log)` turns a parsed nvidia-smi log (`exporter.smi`) into scenario data
(the mapping a scenario YAML file holds, docs/scenarios.md): the part described inline
from the recorded sizes, limits, maximum clocks and PCIe link; the recorded driver
version, GPU UUIDs and PCI bus ids; and one steady phase holding every recorded reading
(memory in use and reserved, power, clocks, temperatures, clock-event reasons, ECC
counts, row remapping, the current PCIe link). A reading nvidia-smi printed as N/A is one
the part does not provide: the fake library answers NotSupported for it, so the exporter
leaves it out. Played by the fake NVML library, the exporter should then show exactly
what nvidia-smi showed; `tests/unit/test_recorded_truth.py` checks that it does.
"""

from __future__ import annotations

from typing import Any, Final

from exporter.gpu_specs import spec_of
from exporter.smi import MIB, SmiError, SmiGpu, SmiLog, SmiProcess

# Exporter clock-event reason -> the scenario key that holds it active.
THROTTLE_KEYS: Final[dict[str, str]] = {
    "sw_power_cap": "throttle_power_cap",
    "sw_thermal": "throttle_sw_thermal",
    "hw_thermal": "throttle_hw_thermal",
    "hw_slowdown": "throttle_hw_slowdown",
    "hw_power_brake": "throttle_power_brake",
}
# Reasons that are no throttle (the exporter leaves them out); the fake derives GPU idle
# from utilization and never raises the display one.
NOT_THROTTLE: Final = frozenset({"gpu_idle", "display_clocks"})
PHASE_SECONDS: Final = 600.0


def scenario_of(
    log: SmiLog, processes: tuple[SmiProcess, ...] | None = None, name: str = "recorded"
) -> dict[str, Any]:
    """Scenario data for the GPUs of `log`, running the compute processes of `processes`
    (`--query-compute-apps`) or else of the log (`-q -x`); SmiError when the log cannot
    be reproduced (GPUs of different parts, a reading the fake has no way to show)."""
    if not log.gpus:
        raise SmiError("the nvidia-smi log lists no GPU")
    if log.driver_version is None:
        raise SmiError("the nvidia-smi log has no driver version")
    first = log.gpus[0]
    model = _model(first)
    for g in log.gpus[1:]:
        if _model(g) != model:
            raise SmiError(f"GPU {g.pci_bus_id} differs from {first.pci_bus_id}: one model per scenario")
    gpus: dict[str, Any] = {
        "count": len(log.gpus),
        "model": model,
        "driver": log.driver_version,
        "uuids": [g.uuid for g in log.gpus],
        "pci_bus_ids": [g.pci_bus_id for g in log.gpus],
        "steady": True,
    }
    if log.cuda_version is not None:
        gpus["cuda"] = log.cuda_version
    index = {g.uuid: i for i, g in enumerate(log.gpus)}
    listed = processes if processes is not None else tuple(p for g in log.gpus for p in g.processes or ())
    running: dict[int, list[dict[str, int]]] = {}
    for p in listed:
        if not p.compute:
            continue  # graphics processes are not in NVML's compute list
        if p.gpu_uuid not in index:
            raise SmiError(f"process {p.pid} runs on {p.gpu_uuid!r}, a GPU the log does not list")
        if p.used_memory_bytes is None:
            raise SmiError(f"process {p.pid}: nvidia-smi recorded no memory use, which the fake must answer")
        entry = {"pid": p.pid, "used_memory_bytes": p.used_memory_bytes}
        running.setdefault(index[p.gpu_uuid], []).append(entry)
    if running:
        gpus["processes"] = running
    data: dict[str, Any] = {
        "name": name,
        "description": f"{len(log.gpus)}x {first.name}, driver {log.driver_version}, as nvidia-smi recorded",
        "gpus": gpus,
        "phases": [
            {
                "name": "recorded",
                "duration": PHASE_SECONDS,
                "gpus": {i: _readings(g) for i, g in enumerate(log.gpus)},
            }
        ],
    }
    if first.mig_enabled:
        data["mig"] = _mig(log)
    return data


def _required(g: SmiGpu, attr: str) -> Any:
    value = getattr(g, attr)
    if value is None:
        raise SmiError(f"GPU {g.pci_bus_id}: nvidia-smi recorded no {attr}, which a GPU model needs")
    return value


def _model(g: SmiGpu) -> dict[str, Any]:
    """The part, inline: what nvidia-smi recorded, and the datasheet where it is silent."""
    spec = spec_of(g.name)
    limit = _required(g, "power_limit_watts")
    if g.power_limit_max_watts is not None and g.power_limit_max_watts != limit:
        raise SmiError(
            f"GPU {g.pci_bus_id}: an enforced power limit ({limit} W) below the maximum "
            f"({g.power_limit_max_watts} W), which the fake library cannot show"
        )
    not_supported = [
        function
        for function, recorded in (
            ("nvmlDeviceGetUtilizationRates", g.gpu_busy_ratio),
            ("nvmlDeviceGetTotalEccErrors", g.ecc_corrected),
            ("nvmlDeviceGetRemappedRows", g.remapped_rows_correctable),
            ("nvmlDeviceGetMigMode", g.mig_enabled),
            ("nvmlDeviceGetPowerUsage", g.power_draw_watts),
            ("nvmlDeviceGetTemperature", g.gpu_celsius),
            ("nvmlDeviceGetClockInfo", g.sm_clock_hertz),
            ("nvmlDeviceGetCurrPcieLinkGeneration", g.pcie_generation),
            ("nvmlDeviceGetCurrPcieLinkWidth", g.pcie_width),
        )
        if recorded is None
    ]
    return {
        "name": g.name,
        "memory_bytes": _required(g, "memory_total_bytes"),
        # Drivers that print no reserved memory count it in `used` (nvmlMemory_t, v1).
        "memory_reserved_bytes": g.memory_reserved_bytes or 0,
        "power_limit_watts": limit,
        "sm_clock_max_hertz": _required(g, "sm_clock_max_hertz"),
        "memory_clock_max_hertz": _required(g, "memory_clock_max_hertz"),
        "nvlinks": (spec.nvlinks or 0) if spec else 0,
        "gpm": spec.gpm if spec else False,
        "pcie_generation": _required(g, "pcie_generation_max"),
        "pcie_width": _required(g, "pcie_width_max"),
        "not_supported": not_supported,
        "fields_not_supported": [] if g.memory_celsius is not None else ["FI_MEMORY_TEMP"],
    }


def _readings(g: SmiGpu) -> dict[str, float]:
    """One GPU's recorded readings as scenario values."""
    total = _required(g, "memory_total_bytes")
    values: dict[str, float] = {"memory_used_ratio": (g.memory_used_bytes or 0) / total}
    # GPU idle (a clock-event reason the exporter leaves out) follows utilization in the fake.
    if g.gpu_busy_ratio is not None:
        values["util"] = g.gpu_busy_ratio
    if g.memory_busy_ratio is not None:
        values["mem_busy"] = g.memory_busy_ratio
    if g.power_draw_watts is not None:
        values["power_ratio"] = g.power_draw_watts / _required(g, "power_limit_watts")
    if g.gpu_celsius is not None:
        values["temp_c"] = g.gpu_celsius
    if g.memory_celsius is not None:
        values["mem_temp_c"] = g.memory_celsius
    if g.sm_clock_hertz is not None:
        values["sm_clock_ratio"] = g.sm_clock_hertz / _required(g, "sm_clock_max_hertz")
    if g.memory_clock_hertz is not None:
        values["mem_clock_ratio"] = g.memory_clock_hertz / _required(g, "memory_clock_max_hertz")
    active = g.clock_events_active or frozenset()
    if unknown := sorted(active - set(THROTTLE_KEYS) - NOT_THROTTLE):
        raise SmiError(f"GPU {g.pci_bus_id}: no scenario key holds clock-event reasons {unknown} active")
    for reason, key in THROTTLE_KEYS.items():
        values[key] = float(reason in active)
    for key, count in (
        ("ecc_corrected_base", g.ecc_corrected),
        ("ecc_uncorrected_base", g.ecc_uncorrected),
        ("remapped_rows_correctable", g.remapped_rows_correctable),
        ("remapped_rows_uncorrectable", g.remapped_rows_uncorrectable),
        ("pcie_link_gen", g.pcie_generation),
        ("pcie_link_width", g.pcie_width),
    ):
        if count is not None:
            values[key] = float(count)
    values["remap_pending"] = float(bool(g.remap_pending))
    values["remap_failed"] = float(bool(g.remap_failed))
    return values


def _mig(log: SmiLog) -> dict[str, Any]:
    """MIG on for the GPUs nvidia-smi saw it on, with the instances it listed."""
    on = [i for i, g in enumerate(log.gpus) if g.mig_enabled]
    devices = log.gpus[on[0]].mig_devices
    if not devices:
        raise SmiError(f"GPU {log.gpus[on[0]].pci_bus_id}: MIG is on but nvidia-smi listed no MIG device")
    total = _required(log.gpus[on[0]], "memory_total_bytes")
    instances = [
        {
            # -q -x names no profile: the instance by its size
            "profile": f"{d.multiprocessors} SMs, {d.memory_total_bytes // MIB} MiB",
            "memory_ratio": d.memory_total_bytes / total,
            "sms": d.multiprocessors,
        }
        for d in devices
    ]
    return {"gpus": on, "instances": instances}
