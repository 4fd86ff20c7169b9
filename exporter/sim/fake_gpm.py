# mypy: disable-error-code="no-any-return"
"""The fake NVML library's GPM: sample buffers and the metrics between two samples."""

from __future__ import annotations

import math
import threading
from typing import Any

import pynvml as N

from exporter.sim.fake_handles import MIB, NOT_SUPPORTED, OK, _address, _out, _set_pointer
from exporter.sim.scenario import GpuModel, Timeline

GPM_MIN_GAP_S = 0.1  # NVML compares only GPM samples at least 100 ms apart
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


def _noise(t: float, gpu: int, key: str) -> float:
    """A small deterministic wobble so charts look alive without hiding the story."""
    return 1.0 + 0.015 * math.sin(t * 0.7 + gpu * 1.3 + len(key))


class GpmSamples:
    """Mixed into FakeLibrary: GPM support, sample buffers and metrics."""

    t: Timeline
    model: GpuModel
    _lock: threading.Lock
    _gpm_samples: dict[int, tuple[int, float]]
    _gpm_live: set[int]
    _next_sample: int

    def _gpu_of(self, handle: Any) -> int:
        raise NotImplementedError

    def nvmlGpmQueryDeviceSupport(self, h: Any, ref: Any) -> int:
        _out(ref).isSupportedDevice = int(self.model.gpm)
        return OK

    def nvmlGpmSampleAlloc(self, ref: Any) -> int:
        with self._lock:
            self._next_sample += 1
            self._gpm_live.add(self._next_sample)
            _set_pointer(ref, self._next_sample)
        return OK

    def nvmlGpmSampleFree(self, sample: Any) -> int:
        with self._lock:
            if _address(sample) not in self._gpm_live:
                return N.NVML_ERROR_INVALID_ARGUMENT
            self._gpm_live.discard(_address(sample))
            self._gpm_samples.pop(_address(sample), None)
        return OK

    @property
    def gpm_samples_allocated(self) -> int:
        """Sample buffers allocated and not yet freed."""
        with self._lock:
            return len(self._gpm_live)

    def nvmlGpmSampleGet(self, h: Any, sample: Any) -> int:
        if not self.model.gpm:
            return NOT_SUPPORTED
        with self._lock:
            if _address(sample) not in self._gpm_live:
                return N.NVML_ERROR_INVALID_ARGUMENT  # never allocated, or freed
            self._gpm_samples[_address(sample)] = (self._gpu_of(h), self.t.now())
        return OK

    def nvmlGpmMetricsGet(self, ref: Any) -> int:
        mg = _out(ref)
        first = self._gpm_samples.get(_address(mg.sample1))
        second = self._gpm_samples.get(_address(mg.sample2))
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
            m.value = self.t.gpu(g, key, now) * _noise(now, g, key) * scale
        return OK
