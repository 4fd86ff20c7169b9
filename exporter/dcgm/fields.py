"""The dcgm-exporter profiling fields the exporter reads, and what each becomes.

Names, types and units follow dcgm-exporter's own counter files (NVIDIA/dcgm-exporter
`etc/default-counters.csv`, `etc/dcp-metrics-included.csv`) and DCGM's field reference
(`dcgmlib/dcgm_fields.h`). Every DCGM_FI_PROF_* value is DCGM's average over its own
sampling window (dcgm-exporter's `--collect-interval`, 30 000 ms by default): a ratio
0-1 for the activity fields, bytes per second for the PCIe and NVLink fields (the CSVs:
"The rate of data transmitted over the PCIe bus ... in bytes per second").
"""

from __future__ import annotations

from dataclasses import dataclass

RATIO = "ratio"
BYTES_PER_SECOND = "bytes_per_second"


@dataclass(frozen=True)
class Field:
    dcgm: str  # the sample name on dcgm-exporter's page
    target: str  # the Profiling field it fills (exporter/gpu_readings.py)
    unit: str
    default_on: bool  # uncommented in dcgm-exporter's default-counters.csv


FIELDS: tuple[Field, ...] = (
    Field("DCGM_FI_PROF_SM_ACTIVE", "sm_active_ratio", RATIO, False),
    Field("DCGM_FI_PROF_SM_OCCUPANCY", "sm_occupancy_ratio", RATIO, False),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active_ratio", RATIO, True),
    Field("DCGM_FI_PROF_DRAM_ACTIVE", "dram_active_ratio", RATIO, True),
    Field("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "fp16_active_ratio", RATIO, False),
    Field("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "fp32_active_ratio", RATIO, False),
    Field("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "fp64_active_ratio", RATIO, False),
    Field("DCGM_FI_PROF_PCIE_TX_BYTES", "pcie_tx_bytes_per_second", BYTES_PER_SECOND, True),
    Field("DCGM_FI_PROF_PCIE_RX_BYTES", "pcie_rx_bytes_per_second", BYTES_PER_SECOND, True),
    Field("DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx_bytes_per_second", BYTES_PER_SECOND, False),
    Field("DCGM_FI_PROF_NVLINK_RX_BYTES", "nvlink_rx_bytes_per_second", BYTES_PER_SECOND, False),
)
# dcgm-exporter's 1.x compatibility mode (`--use-old-namespace`,
# etc/1.x-compatibility-metrics.csv) names a field by go-dcgm's legacy lower-case name
# (NVIDIA/go-dcgm pkg/dcgm/legacy_fields.csv: dcgm_fi_prof_sm_active = 1002, ...): the
# same DCGM field and value under another name. Of the fields read here, these six have one.
LEGACY = ("SM_ACTIVE", "SM_OCCUPANCY", "PIPE_TENSOR_ACTIVE", "DRAM_ACTIVE", "PCIE_TX_BYTES", "PCIE_RX_BYTES")
CANONICAL = {f.dcgm: f for f in FIELDS}
BY_NAME = CANONICAL | {f"dcgm_fi_prof_{n.lower()}": CANONICAL[f"DCGM_FI_PROF_{n}"] for n in LEGACY}
BY_TARGET = {f.target: f for f in FIELDS}

# DCGM marks a value it does not have with sentinels near the top of the type's range
# (dcgm_structs.h: DCGM_FP64_BLANK 140737488355328.0, DCGM_INT64_BLANK 0x7ffffffffffffff0
# and the NOT_FOUND / NOT_SUPPORTED / NOT_PERMISSIONED values just above). dcgm-exporter
# from 3.x on drops them; older builds printed them (its README shows
# DCGM_FI_DEV_MEMORY_TEMP ... 9223372036854775794). Anything at or above the smaller
# sentinel is no measurement.
DCGM_FP64_BLANK = 140737488355328.0
RATIO_MAX = 1.05  # a ratio a little over 1 is rounding; far over it is not a ratio

# Labels dcgm-exporter puts on every GPU sample (internal/pkg/rendermetrics/render_metrics.go):
# `UUID` (`uuid` with --use-old-namespace), `gpu`, `pci_bus_id`, `device`, `modelName`,
# `GPU_I_PROFILE` and `GPU_I_ID` on MIG instances, and the host name as `Hostname`
# (`hostname` from the release that renamed it).
UUID_LABELS = ("UUID", "uuid")
HOSTNAME_LABELS = ("hostname", "Hostname")
MIG_LABEL = "GPU_I_ID"
