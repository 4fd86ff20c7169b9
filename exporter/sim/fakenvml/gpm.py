# mypy: disable-error-code="no-any-return"
"""The fake NVML library's GPM area (Hopper and later): sample buffers, and the metrics
between two samples of one GPU or of one of its MIG GPU instances. No source says how a
GPU instance's activity relates to the GPU's: the fake answers each instance, and the
MIG-enabled parent, with the GPU's own activity keys."""

from __future__ import annotations

import math
import threading
from typing import Any

import pynvml as N

from exporter.sim.fakenvml import mig
from exporter.sim.fakenvml.abi import (
    MIB,
    NOT_SUPPORTED,
    OK,
    Library,
    address,
    noise,
    out,
    set_pointer,
    symbol,
    val,
)

GPM_MIN_GAP_S = 0.1  # NVML compares only GPM samples at least 100 ms apart
# Metric id -> (timeline key, scale to NVML's unit: percent, or MiB per second)
GPM_KEYS = {
    N.NVML_GPM_METRIC_SM_UTIL: ("sm_active", 100.0),
    N.NVML_GPM_METRIC_SM_OCCUPANCY: ("sm_occupancy", 100.0),
    N.NVML_GPM_METRIC_ANY_TENSOR_UTIL: ("tensor_active", 100.0),
    N.NVML_GPM_METRIC_DRAM_BW_UTIL: ("dram_active", 100.0),
    N.NVML_GPM_METRIC_FP16_UTIL: ("fp16_active", 100.0),
    N.NVML_GPM_METRIC_FP32_UTIL: ("fp32_active", 100.0),
    N.NVML_GPM_METRIC_FP64_UTIL: ("fp64_active", 100.0),
    N.NVML_GPM_METRIC_PCIE_TX_PER_SEC: ("pcie_tx_bps", 1 / MIB),
    N.NVML_GPM_METRIC_PCIE_RX_PER_SEC: ("pcie_rx_bps", 1 / MIB),
    N.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: ("nvlink_tx_bps", 1 / MIB),
    N.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: ("nvlink_rx_bps", 1 / MIB),
}

# What a scenario's `gpm_nan` turns to NaN, with NVML_SUCCESS: the SM ratios, whose
# denominators (elapsed SM cycles) a GPU may report as nothing.
NAN_WHEN_ASKED = frozenset({N.NVML_GPM_METRIC_SM_UTIL, N.NVML_GPM_METRIC_SM_OCCUPANCY})


class Samples:
    """The sample buffers a library handed out: made-up addresses, each with the GPU
    and scenario time of its last nvmlGpmSampleGet."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: set[int] = set()
        self.taken: dict[int, tuple[int, float]] = {}  # sample address -> (gpu, time)
        self.last = 0x40_0000


def allocated(lib: Library) -> int:
    """Sample buffers allocated and not yet freed."""
    samples = lib.state(Samples)
    with samples.lock:
        return len(samples.live)


@symbol("nvmlGpmQueryDeviceSupport")
def query_device_support(lib: Library, h: Any, ref: Any) -> int:
    out(ref).isSupportedDevice = int(lib.model.gpm)
    return OK


@symbol("nvmlGpmSampleAlloc")
def sample_alloc(lib: Library, ref: Any) -> int:
    samples = lib.state(Samples)
    with samples.lock:
        samples.last += 1
        samples.live.add(samples.last)
        set_pointer(ref, samples.last)
    return OK


@symbol("nvmlGpmSampleFree")
def sample_free(lib: Library, sample: Any) -> int:
    samples = lib.state(Samples)
    with samples.lock:
        if address(sample) not in samples.live:
            return N.NVML_ERROR_INVALID_ARGUMENT
        samples.live.discard(address(sample))
        samples.taken.pop(address(sample), None)
    return OK


@symbol("nvmlGpmSampleGet")
def sample_get(lib: Library, h: Any, sample: Any) -> int:
    if not lib.model.gpm:
        return NOT_SUPPORTED
    samples = lib.state(Samples)
    with samples.lock:
        if address(sample) not in samples.live:
            return N.NVML_ERROR_INVALID_ARGUMENT  # never allocated, or freed
        samples.taken[address(sample)] = (lib.gpu_of(h), lib.t.now())
    return OK


@symbol("nvmlGpmMigSampleGet")
def mig_sample_get(lib: Library, h: Any, gpu_instance: Any, sample: Any) -> int:
    g = lib.gpu_of(h)
    if not lib.model.gpm:
        return NOT_SUPPORTED
    if not 1 <= val(gpu_instance) <= len(mig.instances(lib.scn, g)):
        return N.NVML_ERROR_NOT_FOUND  # no such GPU instance (ids are slot + 1, as mig.py gives them)
    samples = lib.state(Samples)
    with samples.lock:
        if address(sample) not in samples.live:
            return N.NVML_ERROR_INVALID_ARGUMENT
        samples.taken[address(sample)] = (g, lib.t.now())
    return OK


@symbol("nvmlGpmMetricsGet")
def metrics_get(lib: Library, ref: Any) -> int:
    taken = lib.state(Samples).taken
    mg = out(ref)
    first = taken.get(address(mg.sample1))
    second = taken.get(address(mg.sample2))
    if first is None or second is None:
        return N.NVML_ERROR_INVALID_ARGUMENT
    g, now = second
    if now - first[1] < GPM_MIN_GAP_S:  # NVML refuses to compare samples this close
        return N.NVML_ERROR_INVALID_ARGUMENT
    for i in range(mg.numMetrics):
        m = mg.metrics[i]
        spec = GPM_KEYS.get(m.metricId)
        if spec is None:
            m.nvmlReturn = NOT_SUPPORTED
            continue
        key, scale = spec
        m.nvmlReturn = OK
        if m.metricId in NAN_WHEN_ASKED and lib.t.gpu(g, "gpm_nan", now) >= 0.5:
            m.value = math.nan  # answered, yet no number
            continue
        m.value = lib.t.gpu(g, key, now) * noise(now, g, key) * scale
    return OK
