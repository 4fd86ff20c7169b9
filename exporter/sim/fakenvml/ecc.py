# mypy: disable-error-code="no-any-return"
"""The fake NVML library's ECC area: volatile error counts and row remapping."""

from __future__ import annotations

from typing import Any

import pynvml as N

from exporter.sim.fakenvml.abi import OK, Library, out, symbol, val


@symbol("nvmlDeviceGetTotalEccErrors")
def total_ecc_errors(lib: Library, h: Any, kind: Any, counter: Any, ref: Any) -> int:
    g = lib.gpu_of(h)
    which = "corrected" if val(kind) == N.NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrected"
    before = round(lib.t.gpu(g, f"ecc_{which}_base"))
    out(ref).value = before + int(lib.t.gpu_integral(g, f"ecc_{which}_rate"))
    return OK


@symbol("nvmlDeviceGetRemappedRows")
def remapped_rows(lib: Library, h: Any, corr: Any, unc: Any, pending: Any, failed: Any) -> int:
    g = lib.gpu_of(h)
    # Each uncorrectable error during the scenario remaps a row at the next reset.
    fresh = int(lib.t.gpu_integral(g, "ecc_uncorrected_rate"))
    out(corr).value = round(lib.t.gpu(g, "remapped_rows_correctable"))
    out(unc).value = round(lib.t.gpu(g, "remapped_rows_uncorrectable")) + fresh
    out(pending).value = int(fresh > 0 or lib.t.gpu(g, "remap_pending") >= 0.5)
    out(failed).value = int(lib.t.gpu(g, "remap_failed") >= 0.5)
    return OK
