# mypy: disable-error-code="no-any-return"
"""The fake NVML library's utilization area: how much of the time a kernel ran, and the
memory controller was busy."""

from __future__ import annotations

from typing import Any

from exporter.sim.fakenvml.abi import OK, Library, out, symbol


@symbol("nvmlDeviceGetUtilizationRates")
def utilization_rates(lib: Library, h: Any, ref: Any) -> int:
    g = lib.gpu_of(h)
    rates = out(ref)
    rates.gpu = min(100, round(lib.v(g, "util") * 100))
    rates.memory = min(100, round(lib.v(g, "mem_busy") * 100))
    return OK
