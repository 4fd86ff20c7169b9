# mypy: disable-error-code="no-any-return"
"""The fake NVML library's PCIe area: the link's generation and width (maximum and
trained), its byte counters and replays."""

from __future__ import annotations

from typing import Any

from exporter.nvml import FI_PCIE_COUNT_RX_BYTES, FI_PCIE_COUNT_TX_BYTES, FI_PCIE_REPLAY_COUNTER
from exporter.sim.fakenvml.abi import OK, Library, field, out, symbol

BYTES = {FI_PCIE_COUNT_TX_BYTES: "pcie_tx_bps", FI_PCIE_COUNT_RX_BYTES: "pcie_rx_bps"}


@symbol("nvmlDeviceGetMaxPcieLinkGeneration")
def max_link_generation(lib: Library, h: Any, ref: Any) -> int:
    out(ref).value = lib.model.pcie_generation
    return OK


@symbol("nvmlDeviceGetMaxPcieLinkWidth")
def max_link_width(lib: Library, h: Any, ref: Any) -> int:
    out(ref).value = lib.model.pcie_width
    return OK


@symbol("nvmlDeviceGetCurrPcieLinkGeneration")
def link_generation(lib: Library, h: Any, ref: Any) -> int:
    trained = round(lib.t.gpu(lib.gpu_of(h), "pcie_link_gen"))  # 0: at the maximum
    out(ref).value = trained or lib.model.pcie_generation
    return OK


@symbol("nvmlDeviceGetCurrPcieLinkWidth")
def link_width(lib: Library, h: Any, ref: Any) -> int:
    trained = round(lib.t.gpu(lib.gpu_of(h), "pcie_link_width"))
    out(ref).value = trained or lib.model.pcie_width
    return OK


@field(*BYTES)
def bytes_counted(lib: Library, g: int, fid: int, scope: int) -> float | None:
    """nvml.h: "Value can be wrapped"; no width is given, so a scenario picks where."""
    wrap = lib.t.gpu(g, "pcie_counter_wrap")
    counted = lib.t.gpu_integral(g, BYTES[fid])
    return counted % wrap if wrap >= 1 else counted


@field(FI_PCIE_REPLAY_COUNTER)
def replays(lib: Library, g: int, fid: int, scope: int) -> float | None:
    return lib.t.gpu_integral(g, "pcie_replay_rate")
