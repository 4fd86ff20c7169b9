"""How real drivers and parts differ, for the fake NVML library: one profile per driver
branch and per part quirk. A scenario picks them (`gpus: {model, driver, mig_monitor}`);
without them the fake answers every function and field the exporter reads.

Each entry names what it encodes: a symbol's first driver branch, a struct layout, a
field id's first binding release (nvidia-ml-py releases follow the driver's nvml.h, so a
constant missing from binding 12.N is one driver N does not know).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from exporter import nvml
from exporter.nvml import (
    FI_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
    FI_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    FI_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    FI_MEMORY_TEMP,
    FI_NVLINK_ERROR_DL_CRC,
    FI_NVLINK_ERROR_DL_RECOVERY,
    FI_NVLINK_ERROR_DL_REPLAY,
    FI_PCIE_COUNT_RX_BYTES,
    FI_PCIE_COUNT_TX_BYTES,
    FI_PERF_POLICY_POWER,
)

# Fields first in nvidia-ml-py 12.575 / 13.580 (absent from 12.535-12.570): PCIe byte
# counters and the per-reason clock-event durations other than SW power cap (id 74, the
# old NVML_FI_DEV_PERF_POLICY_POWER, known to every branch here).
NEW_IN_R575 = frozenset(
    {
        FI_PCIE_COUNT_TX_BYTES,
        FI_PCIE_COUNT_RX_BYTES,
        FI_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
        FI_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
        FI_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
    }
)
# Link-scoped NVLink error fields (NVML_FI_DEV_NVLINK_ERROR_DL_*) arrived with R520.
NEW_IN_R520 = frozenset({FI_NVLINK_ERROR_DL_REPLAY, FI_NVLINK_ERROR_DL_RECOVERY, FI_NVLINK_ERROR_DL_CRC})


@dataclass(frozen=True)
class Driver:
    branch: str
    version: str  # nvmlSystemGetDriverVersion
    cuda: int  # nvmlSystemGetCudaDriverVersion, 1000 * major + 10 * minor
    missing: frozenset[str] = frozenset()  # symbols the library does not export
    unknown_fields: frozenset[int] = frozenset()  # ids it refuses inside a successful call
    # Bytes per record nvmlDeviceGetComputeRunningProcesses_v3 writes: 12.2's nvml.h (R535)
    # put usedGpuCcProtectedMemory into nvmlProcessInfo_t (32 bytes); R550 took it out (24).
    process_v3_record: int = 24


DRIVERS: dict[str, Driver] = {
    # R470 (CUDA 11.4): before nvmlDeviceGetComputeRunningProcesses_v3 (R510, and its MPS
    # twin), nvmlDeviceGetMemoryInfo_v2 (R510), GPM (R525), the ClocksEventReasons name
    # (12.2, R535; only ...ThrottleReasons here), nvmlDeviceGetNumaNodeId (binding 12.550)
    # and nvmlDeviceGetProcessesUtilizationInfo (R550: nvmlDeviceGetProcessUtilization serves).
    "R470": Driver(
        "R470",
        "470.256.02",
        11040,
        missing=frozenset(
            {
                "nvmlDeviceGetComputeRunningProcesses_v3",
                "nvmlDeviceGetMPSComputeRunningProcesses_v3",
                "nvmlDeviceGetProcessesUtilizationInfo",
                "nvmlDeviceGetMemoryInfo_v2",
                "nvmlDeviceGetCurrentClocksEventReasons",
                "nvmlDeviceGetNumaNodeId",
                "nvmlGpmQueryDeviceSupport",
                "nvmlGpmSampleAlloc",
                "nvmlGpmSampleFree",
                "nvmlGpmSampleGet",
                "nvmlGpmMetricsGet",
            }
        ),
        unknown_fields=NEW_IN_R575 | NEW_IN_R520,
    ),
    # R515 (CUDA 11.7): _v3 processes and nvmlDeviceGetMemoryInfo_v2 (both R510) with
    # 24-byte records; still before GPM (R525), the link-scoped NVLink error fields (R520),
    # the ClocksEventReasons name, nvmlDeviceGetNumaNodeId, nvmlDeviceGetProcessesUtilizationInfo.
    "R515": Driver(
        "R515",
        "515.105.01",
        11070,
        missing=frozenset(
            {
                "nvmlDeviceGetProcessesUtilizationInfo",
                "nvmlDeviceGetCurrentClocksEventReasons",
                "nvmlDeviceGetNumaNodeId",
                "nvmlGpmQueryDeviceSupport",
                "nvmlGpmSampleAlloc",
                "nvmlGpmSampleFree",
                "nvmlGpmSampleGet",
                "nvmlGpmMetricsGet",
            }
        ),
        unknown_fields=NEW_IN_R575 | NEW_IN_R520,
    ),
    # R535 (CUDA 12.2): 32-byte _v3 process records; no nvmlDeviceGetNumaNodeId (absent
    # from binding 12.535, whose pynvml.py has no such function), nor
    # nvmlDeviceGetProcessesUtilizationInfo (R550, binding 12.550).
    "R535": Driver(
        "R535",
        "535.216.03",
        12020,
        missing=frozenset({"nvmlDeviceGetNumaNodeId", "nvmlDeviceGetProcessesUtilizationInfo"}),
        unknown_fields=NEW_IN_R575,
        process_v3_record=32,
    ),
    "R550": Driver("R550", "550.127.08", 12040, unknown_fields=NEW_IN_R575),
    "R570": Driver("R570", "570.133.20", 12080, unknown_fields=NEW_IN_R575),
    "R580": Driver("R580", "580.65.06", 13000),
}
DEFAULT_DRIVER = "R580"


@dataclass(frozen=True)
class Part:
    """What a GPU part cannot do, beyond its NVLink count and GPM flag in GpuModel."""

    not_supported: frozenset[str] = frozenset()  # functions answering NVML_ERROR_NOT_SUPPORTED
    fields_not_supported: frozenset[int] = frozenset()
    # Grace superchips (GH200, GB200): the GPU's memory is a CPU-less NUMA node of its own,
    # and nvmlDeviceGetNumaNodeId answers that node, not the one its PCI device is on.
    grace: bool = False


PARTS: dict[str, Part] = {
    # Ada on PCIe: no MIG. The L40S remaps rows (nvidia-smi on 595.80 prints its counts,
    # tests/fixtures/nvidia-smi/l40s-595.80-load.query-gpu.csv); no recording shows the
    # L4's, so it keeps answering NotSupported there.
    "L4": Part(not_supported=frozenset({"nvmlDeviceGetMigMode", "nvmlDeviceGetRemappedRows"})),
    "L40S": Part(not_supported=frozenset({"nvmlDeviceGetMigMode"})),
    "GH200-96GB": Part(grace=True),
    # A consumer part: no ECC, MIG, row remapping, NVLink or GPM; no HBM sensor or
    # clock-event durations; no energy counter.
    "RTX-4090": Part(
        not_supported=frozenset(
            {
                "nvmlDeviceGetMigMode",
                "nvmlDeviceGetRemappedRows",
                "nvmlDeviceGetTotalEccErrors",
                "nvmlDeviceGetTotalEnergyConsumption",
                "nvmlDeviceGetNvLinkState",
                "nvmlDeviceGetNvLinkErrorCounter",
            }
        ),
        fields_not_supported=frozenset(
            {
                FI_MEMORY_TEMP,
                FI_PERF_POLICY_POWER,
                FI_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
                FI_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
                FI_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
            }
        ),
    ),
}
NO_QUIRKS = Part()


@dataclass(frozen=True)
class DriverProfile:
    driver: Driver = field(default_factory=lambda: DRIVERS[DEFAULT_DRIVER])
    part: Part = NO_QUIRKS
    # False: a container given MIG devices without NVIDIA_MIG_MONITOR_DEVICES; the MIG
    # parent then answers NVML_ERROR_NO_PERMISSION to memory and process queries.
    mig_monitor: bool = True


def profile(model: str, driver: str | None = None, mig_monitor: bool = True) -> DriverProfile:
    return DriverProfile(DRIVERS[driver or DEFAULT_DRIVER], PARTS.get(model, NO_QUIRKS), mig_monitor)


def resolve_driver(spec: str | None = None, cuda: str | None = None) -> Driver:
    """A branch name ("R535"), or a driver version as nvidia-smi prints it ("535.54.03"):
    the newest branch at or below that version, reporting that version string. `cuda`
    ("12.2") replaces the branch's CUDA version. ValueError says what is wrong."""
    if spec is None or spec in DRIVERS:
        found = DRIVERS[spec or DEFAULT_DRIVER]
    else:
        m = re.fullmatch(r"(\d+)\.\d+(?:\.\d+)?", spec)
        if m is None:
            raise ValueError(f"one of {', '.join(DRIVERS)} or a driver version like 535.54.03, not {spec!r}")
        older = [d for d in DRIVERS.values() if _major(d) <= int(m.group(1))]
        if not older:
            first = min(_major(d) for d in DRIVERS.values())
            raise ValueError(f"a driver version from {first} on, not {spec!r}")
        found = replace(max(older, key=_major), version=spec)
    if cuda is not None:
        c = re.fullmatch(r"(\d+)\.(\d)", cuda)
        if c is None:
            raise ValueError(f"a CUDA version like 12.2, not {cuda!r}")
        found = replace(found, cuda=1000 * int(c.group(1)) + 10 * int(c.group(2)))
    return found


def inline_part(not_supported: Iterable[str] = (), fields_not_supported: Iterable[int | str] = ()) -> Part:
    """A part a scenario describes inline: the NVML functions it answers NotSupported to,
    and the field ids it refuses, as numbers or by their `exporter.nvml` names
    ("FI_MEMORY_TEMP"). ValueError names what is unknown."""
    if isinstance(not_supported, str) or isinstance(fields_not_supported, str):
        raise ValueError("lists in not_supported and fields_not_supported, not a single string")
    functions = frozenset(not_supported)
    if bad := sorted(repr(f) for f in functions if not isinstance(f, str) or not f.startswith("nvml")):
        raise ValueError(f"NVML function names (nvmlDevice...) in not_supported, not {bad}")
    ids = set()
    for f in fields_not_supported:
        value = getattr(nvml, f, None) if isinstance(f, str) and f.startswith("FI_") else f
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"field ids or exporter.nvml FI_ names in fields_not_supported, not {f!r}")
        ids.add(value)
    return Part(not_supported=functions, fields_not_supported=frozenset(ids))


def _major(d: Driver) -> int:
    return int(d.branch.removeprefix("R"))
