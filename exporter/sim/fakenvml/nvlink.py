# mypy: disable-error-code="no-any-return"
"""The fake NVML library's NVLink area: each link's state and error counters, and the
link-scoped field ids (throughput, state, errors) with the all-link sums.

A part's links are `GpuModel.nvlinks`; a PCIe-only part refuses every NVLink query.
Traffic and errors are the whole GPU's timeline rates spread evenly over its links.
The data CRC counter has field ids for links 0-11 only (NVML_FI_DEV_NVLINK_CRC_DATA_
ERROR_COUNT_L0..L11): past them nvmlDeviceGetNvLinkErrorCounter answers InvalidArgument
("device, link, or counter is invalid", nvml.h), the worst a driver may answer there.
"""

from __future__ import annotations

from typing import Any

import pynvml as N

from exporter.nvml import (
    FI_NVLINK_CRC_DATA_ERROR_COUNT,
    FI_NVLINK_ERROR_DL_CRC,
    FI_NVLINK_ERROR_DL_RECOVERY,
    FI_NVLINK_ERROR_DL_REPLAY,
    FI_NVLINK_GET_STATE,
    FI_NVLINK_LINK_COUNT,
    FI_NVLINK_THROUGHPUT_DATA_RX,
    FI_NVLINK_THROUGHPUT_DATA_TX,
    NVLINK_STATE_ACTIVE,
    NVLINK_STATE_INACTIVE,
    NVLINK_STATE_SLEEP,
    SCOPE_ALL_LINKS,
)
from exporter.sim.fakenvml.abi import NOT_SUPPORTED, OK, Library, field, out, symbol, val

THROUGHPUT = {FI_NVLINK_THROUGHPUT_DATA_TX: "nvlink_tx_bps", FI_NVLINK_THROUGHPUT_DATA_RX: "nvlink_rx_bps"}


def flit_crc_errors(lib: Library, g: int) -> int:
    """Flit CRC errors of one link: the scenario's rate spread over the links."""
    return int(lib.t.gpu_integral(g, "nvlink_error_rate") / max(1, lib.model.nvlinks))


def state_of(lib: Library, g: int, link: int) -> int:
    """NVML_NVLINK_STATE_* of a link: the scenario's sleeping links are the highest-numbered,
    its inactive ones those just below; answered alike by the field and the function (nvml.h
    types the function's answer nvmlEnableState_t, but a driver's state has three values)."""
    above = lib.model.nvlinks - link  # 1 for the last link
    sleeping = round(lib.t.gpu(g, "nvlink_links_sleeping"))
    if above <= sleeping:
        return NVLINK_STATE_SLEEP
    if above <= sleeping + round(lib.t.gpu(g, "nvlink_links_inactive")):
        return NVLINK_STATE_INACTIVE
    return NVLINK_STATE_ACTIVE


def _no_such_link(lib: Library, link: Any) -> int | None:
    """The status for a link the part does not have, or None for one it has."""
    if val(link) < lib.model.nvlinks:
        return None
    return NOT_SUPPORTED if lib.model.nvlinks == 0 else N.NVML_ERROR_INVALID_ARGUMENT


@symbol("nvmlDeviceGetNvLinkState")
def link_state(lib: Library, h: Any, link: Any, ref: Any) -> int:
    if (refused := _no_such_link(lib, link)) is not None:
        return refused
    out(ref).value = state_of(lib, lib.gpu_of(h), val(link))
    return OK


@symbol("nvmlDeviceGetNvLinkErrorCounter")
def error_counter(lib: Library, h: Any, link: Any, counter: Any, ref: Any) -> int:
    g = lib.gpu_of(h)
    if (refused := _no_such_link(lib, link)) is not None:
        return refused
    if val(counter) == N.NVML_NVLINK_ERROR_DL_CRC_DATA and val(link) >= len(FI_NVLINK_CRC_DATA_ERROR_COUNT):
        return N.NVML_ERROR_INVALID_ARGUMENT  # no data CRC counter past link 11
    crc = val(counter) == N.NVML_NVLINK_ERROR_DL_CRC_FLIT
    out(ref).value = flit_crc_errors(lib, g) if crc else 0
    return OK


@field(FI_NVLINK_LINK_COUNT)
def link_count(lib: Library, g: int, fid: int, scope: int) -> float | None:
    links = lib.model.nvlinks
    return links if links else None  # PCIe-only parts refuse the field


@field(*THROUGHPUT)
def throughput_kib(lib: Library, g: int, fid: int, scope: int) -> float | None:
    links = lib.model.nvlinks
    if scope >= links and not (scope == SCOPE_ALL_LINKS and links):
        return None
    share = 1 if scope == SCOPE_ALL_LINKS else links  # UINT_MAX: the sum over links
    return lib.t.gpu_integral(g, THROUGHPUT[fid]) / share / 1024


@field(FI_NVLINK_GET_STATE)
def state_field(lib: Library, g: int, fid: int, scope: int) -> float | None:
    return state_of(lib, g, scope) if scope < lib.model.nvlinks else None


@field(FI_NVLINK_ERROR_DL_REPLAY, FI_NVLINK_ERROR_DL_RECOVERY, FI_NVLINK_ERROR_DL_CRC)
def link_errors(lib: Library, g: int, fid: int, scope: int) -> float | None:
    if scope >= lib.model.nvlinks:
        return None
    return flit_crc_errors(lib, g) if fid == FI_NVLINK_ERROR_DL_CRC else 0


@field(FI_NVLINK_CRC_DATA_ERROR_COUNT)  # one id per link: the link is in the id
def data_crc_errors(lib: Library, g: int, fid: int, scope: int) -> float | None:
    return 0 if FI_NVLINK_CRC_DATA_ERROR_COUNT.index(fid) < lib.model.nvlinks else None
