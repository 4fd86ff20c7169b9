"""How real drivers and parts differ, for the fake NVML library: one profile per driver
branch and per part quirk. A scenario picks them (`gpus: {model, driver, mig_monitor, host_pid}`);
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
    FI_MEMORY_TEMP,
    FI_NVLINK_ERROR_DL_CRC,
    FI_NVLINK_ERROR_DL_RECOVERY,
    FI_NVLINK_ERROR_DL_REPLAY,
    FI_PCIE_COUNT_RX_BYTES,
    FI_PCIE_COUNT_TX_BYTES,
    FI_PERF_POLICY_POWER,
    FI_PERF_POLICY_THERMAL,
)

# PCIe byte counters: first in CUDA 12.5's nvml.h (R555) and in nvidia-ml-py 12.555.43;
# absent from 12.550.89 and every release before.
NEW_IN_R555 = frozenset({FI_PCIE_COUNT_TX_BYTES, FI_PCIE_COUNT_RX_BYTES})
# Ids 251-273 by header: nvml.h 12.8 (R570) ends at 268 with the 18 power-smoothing
# settings from 251 (NVML_FI_PWR_SMOOTHING_*); 12.9 and 13.0 (R575, R580 up to 580.65; the
# bindings 12.575.51, 13.580.65) put the SW thermal, HW thermal and HW power brake
# durations at 251-253 and power smoothing at 256-273; 13.1 on (the bindings 13.580.82 on)
# put power smoothing back at 251-268 and the durations at 269-271. Older headers end
# before 251.
FI_SINCE_R570 = frozenset(range(251, 269))
FI_SINCE_R575 = frozenset(range(269, 274))
CLOCK_EVENTS_R575 = (251, 252, 253)  # (SW thermal, HW thermal, HW power brake)
CLOCK_EVENTS_R580_82 = (269, 270, 271)
# nvmlDeviceGetTemperatureV is first in CUDA 12.8's nvml.h (R570); the call it replaces is
# deprecated from CUDA 13.0.
NEW_SYMBOLS_R570 = frozenset({"nvmlDeviceGetTemperatureV"})
# Link-scoped NVLink error fields (NVML_FI_DEV_NVLINK_ERROR_DL_*) arrived with R520.
NEW_IN_R520 = frozenset({FI_NVLINK_ERROR_DL_REPLAY, FI_NVLINK_ERROR_DL_RECOVERY, FI_NVLINK_ERROR_DL_CRC})


@dataclass(frozen=True)
class Driver:
    branch: str
    version: str  # nvmlSystemGetDriverVersion
    cuda: int  # nvmlSystemGetCudaDriverVersion, 1000 * major + 10 * minor
    missing: frozenset[str] = frozenset()  # symbols the library does not export
    unknown_fields: frozenset[int] = frozenset()  # ids it refuses inside a successful call
    # Where the clock-event durations are (SW thermal, HW thermal, HW power brake), and the
    # first of the 18 power-smoothing settings: None where the header has none.
    clock_events: tuple[int, int, int] | None = None
    power_smoothing_from: int | None = None

    @property
    def process_v3_record(self) -> int:
        """Bytes per record nvmlDeviceGetComputeRunningProcesses_v3 writes. nvml.h of CUDA
        12.2.0 and 12.2.1 (nvidia-nvml-dev-cu12 12.2.81, 12.2.128; drivers 535.54, 535.86)
        gave nvmlProcessInfo_t a usedGpuCcProtectedMemory (32 bytes), and nvidia-ml-py
        12.535.77 copied it; 12.2.2's header (12.2.140, driver 535.104) made it the 24-byte
        nvmlProcessInfo_v2_t again and moved the 32-byte layout to nvmlProcessDetail_v1_t
        (nvmlDeviceGetRunningProcessDetailList). The fake writes as each header says."""
        major, minor = (int(x) for x in self.version.split(".")[:2])
        return 32 if major == 535 and minor < 104 else 24


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
                "nvmlGpmMigSampleGet",
                "nvmlGpmMetricsGet",
                *NEW_SYMBOLS_R570,
            }
        ),
        unknown_fields=NEW_IN_R555 | NEW_IN_R520 | FI_SINCE_R570 | FI_SINCE_R575,
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
                "nvmlGpmMigSampleGet",
                "nvmlGpmMetricsGet",
                *NEW_SYMBOLS_R570,
            }
        ),
        unknown_fields=NEW_IN_R555 | NEW_IN_R520 | FI_SINCE_R570 | FI_SINCE_R575,
    ),
    # R535 (CUDA 12.2) as first released, 535.54.03: 32-byte _v3 process records (see
    # Driver.process_v3_record; 535.104 and later write 24); no nvmlDeviceGetNumaNodeId
    # (absent from binding 12.535, whose pynvml.py has no such function), nor
    # nvmlDeviceGetProcessesUtilizationInfo (R550, binding 12.550).
    "R535": Driver(
        "R535",
        "535.54.03",
        12020,
        missing=frozenset(
            {"nvmlDeviceGetNumaNodeId", "nvmlDeviceGetProcessesUtilizationInfo", *NEW_SYMBOLS_R570}
        ),
        unknown_fields=NEW_IN_R555 | FI_SINCE_R570 | FI_SINCE_R575,
    ),
    "R550": Driver(
        "R550",
        "550.127.08",
        12040,
        missing=NEW_SYMBOLS_R570,
        unknown_fields=NEW_IN_R555 | FI_SINCE_R570 | FI_SINCE_R575,
    ),
    "R570": Driver("R570", "570.133.20", 12080, unknown_fields=FI_SINCE_R575, power_smoothing_from=251),
    # R575 and R580 up to 580.65: the durations at 251-253, power smoothing at 256-273.
    "R575": Driver("R575", "575.64.05", 12090, clock_events=CLOCK_EVENTS_R575, power_smoothing_from=256),
    "R580": Driver("R580", "580.65.06", 13000, clock_events=CLOCK_EVENTS_R575, power_smoothing_from=256),
    # 580.82 on (and every later branch): the durations at 269-271, power smoothing at 251.
    "R580.82": Driver(
        "R580.82", "580.82.07", 13000, clock_events=CLOCK_EVENTS_R580_82, power_smoothing_from=251
    ),
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
                FI_PERF_POLICY_THERMAL,
                *CLOCK_EVENTS_R575,
                *CLOCK_EVENTS_R580_82,
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
    # False: an exporter without the host's PID namespace (a pod without hostPID). The
    # driver translates each GPU process' pid into the caller's namespace and leaves out
    # those it cannot see there; the fake's processes belong to other pods: none is listed.
    host_pid: bool = True


def profile(
    model: str, driver: str | None = None, mig_monitor: bool = True, host_pid: bool = True
) -> DriverProfile:
    return DriverProfile(
        DRIVERS[driver or DEFAULT_DRIVER], PARTS.get(model, NO_QUIRKS), mig_monitor, host_pid
    )


def resolve_driver(spec: str | None = None, cuda: str | None = None) -> Driver:
    """A branch name ("R535"), or a driver version as nvidia-smi prints it ("535.54.03"):
    the newest branch at or below that version, reporting that version string. `cuda`
    ("12.2") replaces the branch's CUDA version. ValueError says what is wrong."""
    if spec is None or spec in DRIVERS:
        found = DRIVERS[spec or DEFAULT_DRIVER]
    else:
        m = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?", spec)
        if m is None:
            raise ValueError(f"one of {', '.join(DRIVERS)} or a driver version like 535.54.03, not {spec!r}")
        older = [d for d in DRIVERS.values() if _release(d) <= (int(m.group(1)), int(m.group(2)))]
        if not older:
            first = min(_release(d)[0] for d in DRIVERS.values())
            raise ValueError(f"a driver version from {first} on, not {spec!r}")
        found = replace(max(older, key=_release), version=spec)
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


def _release(d: Driver) -> tuple[int, int]:
    """The first driver release a profile stands for: R535 -> (535, 0), R580.82 -> (580, 82)."""
    major, _, minor = d.branch.removeprefix("R").partition(".")
    return int(major), int(minor or 0)
