"""Typed GPU readings. Each field declares the metric it is exposed as.

Units are in the field names; ratios are 0-1. A field left `None` is a quantity the
GPU does not support, and its series is absent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

from exporter.metricdef import Labels, counter, gauge, info, label, nested, owner_labels


@dataclass(frozen=True)
class DeviceFacts:
    """Static facts; change only on driver reload or reconfiguration."""

    family: ClassVar[str] = "device"
    uuid: str = ""  # carried into every GPU series' labels, not exported on its own
    labels: dict[str, str] | None = info(
        "llmgpu_gpu_info",
        "Static GPU facts: name, PCI bus id, driver and CUDA version, NUMA node, MIG and "
        "persistence mode (nvmlDeviceGetName, nvmlDeviceGetPciInfo, nvmlSystemGetDriverVersion, sysfs)",
    )
    memory_total_bytes: int | None = gauge(
        "llmgpu_gpu_memory_total_bytes", "Total framebuffer memory (nvmlDeviceGetMemoryInfo)"
    )
    sm_clock_max_hertz: float | None = gauge(
        "llmgpu_gpu_sm_clock_max_hertz", "Maximum SM clock (nvmlDeviceGetMaxClockInfo)"
    )
    memory_clock_max_hertz: float | None = gauge(
        "llmgpu_gpu_memory_clock_max_hertz",
        "Maximum memory clock (nvmlDeviceGetMaxClockInfo)",
        profile="full",
    )
    power_limit_max_watts: float | None = gauge(
        "llmgpu_gpu_power_limit_max_watts",
        "Largest settable power limit (nvmlDeviceGetPowerManagementLimitConstraints)",
        profile="full",
    )
    dram_bandwidth_peak_bytes_per_second: float | None = gauge(
        "llmgpu_gpu_dram_bandwidth_peak_bytes_per_second",
        "Datasheet peak DRAM bandwidth for this GPU model (built-in table)",
    )
    pcie_link_generation_max: int | None = gauge(
        "llmgpu_gpu_pcie_link_generation_max",
        "Maximum PCIe generation (nvmlDeviceGetMaxPcieLinkGeneration)",
        profile="full",
    )
    pcie_link_width_max: int | None = gauge(
        "llmgpu_gpu_pcie_link_width_max", "Maximum PCIe lanes (nvmlDeviceGetMaxPcieLinkWidth)", profile="full"
    )

    def get(self, key: str) -> str:
        return (self.labels or {}).get(key, "")


@dataclass(frozen=True)
class Utilization:
    family: ClassVar[str] = "utilization"
    gpu_busy_ratio: float | None = gauge(
        "llmgpu_gpu_utilization_ratio",
        "Fraction of the last sample period a kernel was running (nvmlDeviceGetUtilizationRates.gpu)",
    )
    memory_busy_ratio: float | None = gauge(
        "llmgpu_gpu_memory_busy_ratio",
        "Fraction of the last sample period device memory was read or written "
        "(nvmlDeviceGetUtilizationRates.memory)",
    )


@dataclass(frozen=True)
class Memory:
    family: ClassVar[str] = "memory"
    used_bytes: int | None = gauge(
        "llmgpu_gpu_memory_used_bytes", "Allocated framebuffer memory (nvmlDeviceGetMemoryInfo_v2)"
    )
    free_bytes: int | None = gauge(
        "llmgpu_gpu_memory_free_bytes", "Unallocated framebuffer memory (nvmlDeviceGetMemoryInfo_v2)"
    )
    reserved_bytes: int | None = gauge(
        "llmgpu_gpu_memory_reserved_bytes",
        "Memory reserved by the driver and firmware (nvmlDeviceGetMemoryInfo_v2)",
    )
    bar1_used_bytes: int | None = gauge(
        "llmgpu_gpu_bar1_used_bytes",
        "Used BAR1 aperture memory (nvmlDeviceGetBAR1MemoryInfo)",
        profile="full",
    )
    bar1_total_bytes: int | None = gauge(
        "llmgpu_gpu_bar1_total_bytes",
        "Total BAR1 aperture memory (nvmlDeviceGetBAR1MemoryInfo)",
        profile="full",
    )


@dataclass(frozen=True)
class Clocks:
    family: ClassVar[str] = "clocks"
    sm_hertz: float | None = gauge("llmgpu_gpu_sm_clock_hertz", "Current SM clock (nvmlDeviceGetClockInfo)")
    memory_hertz: float | None = gauge(
        "llmgpu_gpu_memory_clock_hertz", "Current memory clock (nvmlDeviceGetClockInfo)", profile="full"
    )
    event_active: dict[str, int] | None = gauge(
        "llmgpu_gpu_clock_event_active",
        "1 while the clock-event (throttle) reason holds clocks down "
        "(nvmlDeviceGetCurrentClocksEventReasons)",
        label="reason",
    )
    event_seconds: dict[str, float] | None = counter(
        "llmgpu_gpu_clock_event_seconds_total",
        "Cumulative time clocks were held down, by reason "
        "(nvmlDeviceGetFieldValues NVML_FI_DEV_PERF_POLICY_POWER/_THERMAL, and "
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_* where the driver's numbering is known)",
        label="reason",
    )


@dataclass(frozen=True)
class Power:
    family: ClassVar[str] = "power"
    usage_watts: float | None = gauge("llmgpu_gpu_power_watts", "Power draw (nvmlDeviceGetPowerUsage)")
    limit_watts: float | None = gauge(
        "llmgpu_gpu_power_limit_watts", "Enforced power limit (nvmlDeviceGetEnforcedPowerLimit)"
    )
    energy_joules: float | None = counter(
        "llmgpu_gpu_energy_joules_total",
        "Energy used since the driver loaded (nvmlDeviceGetTotalEnergyConsumption)",
    )  # in the default profile: energy per token is rebuilt from it out of a TSDB too
    gpu_celsius: float | None = gauge(
        "llmgpu_gpu_temperature_celsius",
        "GPU die temperature (nvmlDeviceGetTemperatureV; nvmlDeviceGetTemperature before R570)",
    )
    memory_celsius: float | None = gauge(
        "llmgpu_gpu_memory_temperature_celsius",
        "HBM temperature (nvmlDeviceGetFieldValues NVML_FI_DEV_MEMORY_TEMP)",
    )


@dataclass(frozen=True)
class Profiling:
    """Profiling counters: SM, tensor, DRAM and pipe activity, PCIe and NVLink rates.

    Two sources give them: NVML GPM (Hopper and later; activity between two samples this
    process takes) and a co-located dcgm-exporter's DCGM_FI_PROF_* fields (Volta and later
    data-center parts; DCGM's averages over its own sampling window, joined by UUID). GPM
    wins field by field where both answer (`merge_fields`; the dcgm collector has the
    lower precedence); `llmgpu_gpu_metric_source` says which one gave each metric.
    """

    family: ClassVar[str] = "gpm"
    merge_fields: ClassVar[bool] = True
    sm_active_ratio: float | None = gauge(
        "llmgpu_gpu_sm_active_ratio",
        "Fraction of SMs busy (GPM NVML_GPM_METRIC_SM_UTIL; DCGM_FI_PROF_SM_ACTIVE)",
    )
    sm_occupancy_ratio: float | None = gauge(
        "llmgpu_gpu_sm_occupancy_ratio",
        "Resident warps over the theoretical maximum (GPM NVML_GPM_METRIC_SM_OCCUPANCY; "
        "DCGM_FI_PROF_SM_OCCUPANCY)",
        profile="full",
    )
    tensor_active_ratio: float | None = gauge(
        "llmgpu_gpu_tensor_active_ratio",
        "Fraction of time tensor cores were busy (GPM NVML_GPM_METRIC_ANY_TENSOR_UTIL; "
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)",
    )
    dram_active_ratio: float | None = gauge(
        "llmgpu_gpu_dram_active_ratio",
        "DRAM bandwidth used over its theoretical maximum (GPM NVML_GPM_METRIC_DRAM_BW_UTIL; "
        "DCGM_FI_PROF_DRAM_ACTIVE)",
    )
    fp16_active_ratio: float | None = gauge(
        "llmgpu_gpu_fp16_active_ratio",
        "Non-tensor FP16 pipe activity (GPM NVML_GPM_METRIC_FP16_UTIL; DCGM_FI_PROF_PIPE_FP16_ACTIVE)",
        profile="full",
    )
    fp32_active_ratio: float | None = gauge(
        "llmgpu_gpu_fp32_active_ratio",
        "Non-tensor FP32 pipe activity (GPM NVML_GPM_METRIC_FP32_UTIL; DCGM_FI_PROF_PIPE_FP32_ACTIVE)",
    )
    fp64_active_ratio: float | None = gauge(
        "llmgpu_gpu_fp64_active_ratio",
        "Non-tensor FP64 pipe activity (GPM NVML_GPM_METRIC_FP64_UTIL; DCGM_FI_PROF_PIPE_FP64_ACTIVE)",
        profile="full",
    )
    pcie_tx_bytes_per_second: float | None = gauge(
        "llmgpu_gpu_pcie_tx_bytes_per_second",
        "PCIe traffic out of the GPU (GPM NVML_GPM_METRIC_PCIE_TX_PER_SEC; DCGM_FI_PROF_PCIE_TX_BYTES)",
        profile="full",
    )
    pcie_rx_bytes_per_second: float | None = gauge(
        "llmgpu_gpu_pcie_rx_bytes_per_second",
        "PCIe traffic into the GPU (GPM NVML_GPM_METRIC_PCIE_RX_PER_SEC; DCGM_FI_PROF_PCIE_RX_BYTES)",
        profile="full",
    )
    nvlink_tx_bytes_per_second: float | None = gauge(
        "llmgpu_gpu_nvlink_tx_bytes_per_second",
        "NVLink traffic out of the GPU, all links (GPM NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC; "
        "DCGM_FI_PROF_NVLINK_TX_BYTES)",
    )
    nvlink_rx_bytes_per_second: float | None = gauge(
        "llmgpu_gpu_nvlink_rx_bytes_per_second",
        "NVLink traffic into the GPU, all links (GPM NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC; "
        "DCGM_FI_PROF_NVLINK_RX_BYTES)",
    )


@dataclass(frozen=True)
class MetricSource:
    metric: str = label()
    source: str = label()
    active: int | None = gauge(
        "llmgpu_gpu_metric_source",
        "1 for the collector that gave the GPU's metric this cycle, where two can: gpm (NVML GPM) "
        "or dcgm (a co-located dcgm-exporter) (runner)",
        profile="full",  # one series per profiling metric: `--metric llmgpu_gpu_metric_source`
    )


@dataclass(frozen=True)
class MigActivity:
    """GPM activity of one MIG GPU instance, between two nvmlGpmMigSampleGet samples."""

    gpu_instance: int = label()
    sm_active_ratio: float | None = gauge(
        "llmgpu_gpu_mig_sm_active_ratio",
        "Fraction of the GPU instance's SMs busy (nvmlGpmMigSampleGet NVML_GPM_METRIC_SM_UTIL)",
    )
    tensor_active_ratio: float | None = gauge(
        "llmgpu_gpu_mig_tensor_active_ratio",
        "Fraction of time the GPU instance's tensor cores were busy "
        "(nvmlGpmMigSampleGet NVML_GPM_METRIC_ANY_TENSOR_UTIL)",
    )
    dram_active_ratio: float | None = gauge(
        "llmgpu_gpu_mig_dram_active_ratio",
        "DRAM bandwidth the GPU instance used over its theoretical maximum "
        "(nvmlGpmMigSampleGet NVML_GPM_METRIC_DRAM_BW_UTIL)",
    )


@dataclass(frozen=True)
class MigProfiling:
    family: ClassVar[str] = "gpm_mig"
    instances: tuple[MigActivity, ...] = nested(MigActivity)


@dataclass(frozen=True)
class MetricSources:
    """Per GPU and metric of the profiling family, which source it came from."""

    family: ClassVar[str] = "sources"
    items: tuple[MetricSource, ...] = nested(MetricSource)


@dataclass(frozen=True)
class Pcie:
    family: ClassVar[str] = "pcie"
    tx_bytes: int | None = counter(
        "llmgpu_gpu_pcie_tx_bytes_total",
        "Bytes sent over PCIe (nvmlDeviceGetFieldValues NVML_FI_DEV_PCIE_COUNT_TX_BYTES)",
    )
    rx_bytes: int | None = counter(
        "llmgpu_gpu_pcie_rx_bytes_total",
        "Bytes received over PCIe (nvmlDeviceGetFieldValues NVML_FI_DEV_PCIE_COUNT_RX_BYTES)",
    )
    replays: int | None = counter(
        "llmgpu_gpu_pcie_replays_total",
        "PCIe link replays (nvmlDeviceGetFieldValues NVML_FI_DEV_PCIE_REPLAY_COUNTER)",
    )
    link_generation: int | None = gauge(
        "llmgpu_gpu_pcie_link_generation",
        "Current PCIe generation (nvmlDeviceGetCurrPcieLinkGeneration)",
        profile="full",
    )
    link_width: int | None = gauge(
        "llmgpu_gpu_pcie_link_width", "Current PCIe lanes (nvmlDeviceGetCurrPcieLinkWidth)", profile="full"
    )


@dataclass(frozen=True)
class NvLinkPort:
    """One link: per-link detail, exposed in the full profile only."""

    link: int = label()
    up: int | None = gauge(
        "llmgpu_gpu_nvlink_link_up",
        "1 while the link is active, 0 while inactive or asleep (NVML_FI_DEV_NVLINK_GET_STATE)",
        profile="full",
    )
    sleeping: int | None = gauge(
        "llmgpu_gpu_nvlink_link_sleeping",
        "1 while the link is in its low-power sleep state (NVML_FI_DEV_NVLINK_GET_STATE = SLEEP)",
        profile="full",
    )
    tx_bytes: int | None = counter(
        "llmgpu_gpu_nvlink_link_tx_bytes_total",
        "Data bytes sent on the link (nvmlDeviceGetFieldValues NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX)",
        profile="full",
    )
    rx_bytes: int | None = counter(
        "llmgpu_gpu_nvlink_link_rx_bytes_total",
        "Data bytes received on the link (nvmlDeviceGetFieldValues NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)",
        profile="full",
    )
    errors: dict[str, int] | None = counter(
        "llmgpu_gpu_nvlink_link_errors_total",
        "Link errors by type (nvmlDeviceGetNvLinkErrorCounter)",
        label="type",
        profile="full",
    )


def _sum(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


@dataclass(frozen=True)
class NvLink:
    """A GPU's links, and their per-GPU totals (filled from the links when not given).

    The totals are what the default profile exposes: 8 series per link (144 on an H100)
    fold into 6 per GPU, and they are what the diagnosis reads.
    """

    family: ClassVar[str] = "nvlink"
    link_count: int | None = gauge(
        "llmgpu_gpu_nvlink_links", "Links whose state NVML reports (nvmlDeviceGetNvLinkState)"
    )
    links_up: int | None = gauge(
        "llmgpu_gpu_nvlink_links_up",
        "Links active, of llmgpu_gpu_nvlink_links (NVML_FI_DEV_NVLINK_GET_STATE = ACTIVE)",
    )
    links_sleeping: int | None = gauge(
        "llmgpu_gpu_nvlink_links_sleeping",
        "Links asleep, of llmgpu_gpu_nvlink_links: neither down nor active; "
        "they wake for traffic (NVML_FI_DEV_NVLINK_GET_STATE = SLEEP)",
    )
    tx_bytes: int | None = counter(
        "llmgpu_gpu_nvlink_tx_bytes_total",
        "Data bytes sent on all links together "
        "(nvmlDeviceGetFieldValues NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, summed over links)",
    )
    rx_bytes: int | None = counter(
        "llmgpu_gpu_nvlink_rx_bytes_total",
        "Data bytes received on all links together "
        "(nvmlDeviceGetFieldValues NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, summed over links)",
    )
    errors: int | None = counter(
        "llmgpu_gpu_nvlink_errors_total",
        "Link errors of every type on all links together (nvmlDeviceGetNvLinkErrorCounter, summed)",
    )
    links: tuple[NvLinkPort, ...] = nested(NvLinkPort)

    def __post_init__(self) -> None:
        # Frozen: each total is set once here, from the links, unless the caller gave it.
        def put(name: str, value: Callable[[], int | None]) -> None:
            if getattr(self, name) is None:
                object.__setattr__(self, name, value())

        states = [p.up for p in self.links if p.up is not None]
        if states or not self.links:
            put("link_count", lambda: len(states))
            put("links_up", lambda: sum(states))
            put("links_sleeping", lambda: sum(p.sleeping or 0 for p in self.links if p.up is not None))
        put("tx_bytes", lambda: _sum(p.tx_bytes for p in self.links))
        put("rx_bytes", lambda: _sum(p.rx_bytes for p in self.links))
        put("errors", lambda: _sum(v for p in self.links for v in (p.errors or {}).values()))


@dataclass(frozen=True)
class Ecc:
    family: ClassVar[str] = "ecc"
    corrected: int | None = counter(
        "llmgpu_gpu_ecc_corrected_errors_total",
        "Corrected (single-bit) ECC errors, volatile (nvmlDeviceGetTotalEccErrors)",
    )
    uncorrected: int | None = counter(
        "llmgpu_gpu_ecc_uncorrected_errors_total",
        "Uncorrected (double-bit) ECC errors, volatile (nvmlDeviceGetTotalEccErrors)",
    )
    remapped_rows: dict[str, int] | None = gauge(
        "llmgpu_gpu_remapped_rows",
        "Rows remapped after ECC errors, by cause (nvmlDeviceGetRemappedRows)",
        label="cause",
        profile="full",
    )
    remap_pending: int | None = gauge(
        "llmgpu_gpu_row_remap_pending", "1 when a row remap awaits a GPU reset (nvmlDeviceGetRemappedRows)"
    )
    remap_failed: int | None = gauge(
        "llmgpu_gpu_row_remap_failed", "1 when a row remap failed (nvmlDeviceGetRemappedRows)"
    )


@dataclass(frozen=True)
class Xid:
    family: ClassVar[str] = "xid"
    counts: dict[int, int] | None = counter(
        "llmgpu_gpu_xid_errors_total",
        "XID critical errors seen since the exporter started (nvmlEventSetWait_v2)",
        label="xid",
    )


@dataclass(frozen=True)
class GpuProcess:
    pid: int = label()
    process: str = label()
    owner: Labels = owner_labels()  # its pod, from its cgroup (namespace, pod, container, pod labels)
    used_bytes: int | None = gauge(
        "llmgpu_gpu_process_memory_used_bytes",
        "Memory used by a compute process (nvmlDeviceGetComputeRunningProcesses; under MPS, "
        "nvmlDeviceGetMPSComputeRunningProcesses)",
    )
    sm_ratio: float | None = gauge(
        "llmgpu_gpu_process_sm_utilization_ratio",
        "Share of the GPU's SM time the process used over the last sampling window, mean of its "
        "samples (nvmlDeviceGetProcessesUtilizationInfo, else nvmlDeviceGetProcessUtilization)",
        profile="shared",
    )
    memory_activity_ratio: float | None = gauge(
        "llmgpu_gpu_process_memory_activity_ratio",
        "Share of the time the memory controller was busy for the process over the last sampling "
        "window (the same calls' memUtil)",
        profile="shared",
    )


@dataclass(frozen=True)
class Tenant:
    """One container's part of a shared GPU: its processes added up."""

    owner: Labels = owner_labels()
    sm_ratio: float | None = gauge(
        "llmgpu_gpu_pod_sm_utilization_ratio",
        "Share of the GPU's SM time a container's processes used over the last sampling window "
        "(their llmgpu_gpu_process_sm_utilization_ratio added up)",
        profile="shared",
    )
    used_bytes: int | None = gauge(
        "llmgpu_gpu_pod_memory_used_bytes",
        "Memory a container's processes hold on the GPU (their llmgpu_gpu_process_memory_used_bytes "
        "added up)",
        profile="shared",
    )
    processes: int | None = gauge(
        "llmgpu_gpu_pod_processes", "A container's compute processes on the GPU", profile="shared"
    )


@dataclass(frozen=True)
class Processes:
    family: ClassVar[str] = "processes"
    count: int | None = gauge(
        "llmgpu_gpu_processes", "Compute processes on the GPU (nvmlDeviceGetComputeRunningProcesses)"
    )
    items: tuple[GpuProcess, ...] = nested(GpuProcess)
    tenants: tuple[Tenant, ...] = nested(Tenant)  # by container, where processes have an owner


@dataclass(frozen=True)
class NvmlSession:
    """Node reading of the device collector: the NVML session across driver reloads."""

    restarts: int | None = counter(
        "llmgpu_exporter_nvml_restarts_total",
        "NVML sessions rebuilt after the driver went away or came back as another version, "
        "answering Uninitialized, DriverNotLoaded or LibRmVersionMismatch (nvmlShutdown, nvmlInit)",
    )


@dataclass(frozen=True)
class PidNamespace:
    """Node reading of the processes collector: whether NVML's process lists can be whole."""

    host: int | None = gauge(
        "llmgpu_exporter_host_pid_namespace",
        "1 when the exporter shares the host's PID namespace, 0 when it does not: the driver "
        "then lists only the processes visible from the exporter's namespace, and the process "
        "series are left out (/proc/self/ns/pid)",
    )


@dataclass(frozen=True)
class MigInstance:
    mig_uuid: str = label()
    gpu_instance: int = label()
    compute_instance: int = label()
    memory_used_bytes: int | None = gauge(
        "llmgpu_gpu_mig_memory_used_bytes", "Memory used in a MIG instance (nvmlDeviceGetMemoryInfo)"
    )
    memory_total_bytes: int | None = gauge(
        "llmgpu_gpu_mig_memory_total_bytes", "Memory of a MIG instance (nvmlDeviceGetMemoryInfo)"
    )
    multiprocessors: int | None = gauge(
        "llmgpu_gpu_mig_multiprocessors", "SMs in a MIG instance (nvmlDeviceGetAttributes)"
    )


@dataclass(frozen=True)
class Mig:
    family: ClassVar[str] = "mig"
    enabled: int | None = gauge("llmgpu_gpu_mig_enabled", "1 when MIG mode is on (nvmlDeviceGetMigMode)")
    instances: tuple[MigInstance, ...] = nested(MigInstance)


GPU_READINGS: tuple[type, ...] = (
    DeviceFacts,
    Utilization,
    Memory,
    Clocks,
    Power,
    Profiling,
    MetricSources,
    Pcie,
    NvLink,
    Ecc,
    Xid,
    Processes,
    Mig,
    MigProfiling,
)
