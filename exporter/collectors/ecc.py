"""Memory health: volatile ECC error counts and row remapping."""

from __future__ import annotations

from typing import Any

from exporter.collectors.base import Context, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import Ecc
from exporter.nvml import const as N


class EccCollector(GpuCollector):
    name = "ecc"
    default_interval = 10.0

    def read(self, index: int, h: Any) -> Ecc:
        q = self.query
        corrected = q(
            N.nvmlDeviceGetTotalEccErrors, h, N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_VOLATILE_ECC
        )
        uncorrected = q(
            N.nvmlDeviceGetTotalEccErrors, h, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_VOLATILE_ECC
        )
        rows = q(N.nvmlDeviceGetRemappedRows, h)
        return Ecc(
            corrected=corrected,
            uncorrected=uncorrected,
            remapped_rows=None if rows is None else {"correctable": rows[0], "uncorrectable": rows[1]},
            remap_pending=None if rows is None else int(bool(rows[2])),
            remap_failed=None if rows is None else int(bool(rows[3])),
        )


@register("ecc", "ECC error counters and row remapping (every 10 intervals)", nvml=True)
def _factory(ctx: Context) -> EccCollector:
    return EccCollector(ctx)
