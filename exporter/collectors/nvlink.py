"""NVLink: link state, byte counters and error counters, from field values.

One field-values call per GPU: the link count once, then each run the byte counters
and, every SLOW_EVERY runs, link state and error counters (fields with scopeId = link).
The byte counters are the all-links sums (scopeId UINT_MAX) unless the per-link ones
are exposed (the full profile) or the driver refuses the sum. Only what the driver
refuses as a field falls back to the per-link functions (older drivers; data CRC past
link 11, which has no field id).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from exporter.collectors.base import Context, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import NvLink, NvLinkPort
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
    NvmlError,
)
from exporter.nvml import const as N

# error type label -> (link-scoped field id, nvmlDeviceGetNvLinkErrorCounter counter)
NVLINK_ERRORS = {
    "replay": (FI_NVLINK_ERROR_DL_REPLAY, N.NVML_NVLINK_ERROR_DL_REPLAY),
    "recovery": (FI_NVLINK_ERROR_DL_RECOVERY, N.NVML_NVLINK_ERROR_DL_RECOVERY),
    "crc_flit": (FI_NVLINK_ERROR_DL_CRC, N.NVML_NVLINK_ERROR_DL_CRC_FLIT),
}
CRC_DATA_COUNTER = N.NVML_NVLINK_ERROR_DL_CRC_DATA
MAX_LINKS = N.NVML_NVLINK_MAX_LINKS
SLOW_EVERY = 10  # state and error counters change rarely: read every 10 runs
BYTES = (FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX)
SUMS = [(fid, SCOPE_ALL_LINKS) for fid in BYTES]

Health = tuple[int | None, dict[str, int] | None]  # (NVML_NVLINK_STATE_*, error counters)
STATES = (NVLINK_STATE_INACTIVE, NVLINK_STATE_ACTIVE, NVLINK_STATE_SLEEP)


def _port(link: int, state: int | None, **values: Any) -> NvLinkPort:
    """A link whose state is one nvml.h names; any other answer leaves its state unknown."""
    known = state in STATES
    up = int(state == NVLINK_STATE_ACTIVE) if known else None
    sleeping = int(state == NVLINK_STATE_SLEEP) if known else None
    return NvLinkPort(link, up, sleeping, **values)


def _health_fields(link: int) -> list[tuple[int, int]]:
    ids = [(FI_NVLINK_GET_STATE, link), *((fid, link) for fid, _ in NVLINK_ERRORS.values())]
    if link < len(FI_NVLINK_CRC_DATA_ERROR_COUNT):
        ids.append((FI_NVLINK_CRC_DATA_ERROR_COUNT[link], 0))  # the link is in the id
    return ids


class NvLinkCollector(GpuCollector):
    name = "nvlink"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._links: dict[int, list[int]] = {}  # GPU -> its links, learnt once
        self._runs: dict[int, int] = {}
        self._health: dict[int, dict[int, Health]] = {}
        self._state: dict[int, NvLink] = {}  # links and their folded totals, per slow run
        metrics = {
            f.name: f.metadata["metric"] for f in dataclasses.fields(NvLinkPort) if "metric" in f.metadata
        }
        self._per_link = any(ctx.exposed(metrics[name]) for name in ("tx_bytes", "rx_bytes"))
        self._no_sums: set[int] = set()  # GPUs whose driver refused the all-links scope

    def _count(self, h: Any) -> list[int]:
        count = self.field_values(h, [(FI_NVLINK_LINK_COUNT, 0)]).get((FI_NVLINK_LINK_COUNT, 0))
        if count is not None:
            return list(range(min(int(count), MAX_LINKS)))
        return self._probe(h)

    def _probe(self, h: Any) -> list[int]:
        """Drivers without the link-count field: links answer until the first that does not."""
        links = []
        for link in range(MAX_LINKS):
            try:
                state = self.nvml.query(N.nvmlDeviceGetNvLinkState, h, link)
            except NvmlError as err:
                if err.name == "InvalidArgument":  # past the last link
                    break
                raise
            if state is None:
                break
            links.append(link)
        return links

    def forget(self, index: int) -> None:
        self._links.pop(index, None)
        self._runs.pop(index, None)
        self._health.pop(index, None)
        self._state.pop(index, None)
        self._no_sums.discard(index)

    def read(self, index: int, h: Any) -> NvLink | None:
        if index not in self._links:
            self._links[index] = self._count(h)
        links = self._links[index]
        if not links:
            return None
        runs = self._runs.get(index, 0)
        self._runs[index] = runs + 1
        slow = runs % SLOW_EVERY == 0 or index not in self._health
        summed = not self._per_link and index not in self._no_sums
        ids = list(SUMS) if summed else [(fid, link) for link in links for fid in BYTES]
        if slow:
            ids += [f for link in links for f in _health_fields(link)]
        got = self.field_values(h, ids)
        if summed and any(f not in got for f in SUMS):
            per_link = self.field_values(h, [(fid, link) for link in links for fid in BYTES])
            if per_link:  # the driver answers the links but not their sum: links from now on
                self._no_sums.add(index)
            got.update(per_link)
            summed = False
        if slow:
            self._health[index] = {link: self._link_health(h, link, got) for link in links}
            self._state.pop(index, None)
        health = self._health[index]
        if summed:
            # The links carry only state and errors, which change on slow runs: their
            # totals are folded once per slow run and the bytes put beside them.
            state = self._state.get(index)
            if state is None:
                state = self._state[index] = NvLink(
                    links=tuple(_port(link, health[link][0], errors=health[link][1]) for link in links)
                )
            return dataclasses.replace(state, tx_bytes=_bytes(got[SUMS[0]]), rx_bytes=_bytes(got[SUMS[1]]))
        ports = []
        for link in links:
            tx = got.get((FI_NVLINK_THROUGHPUT_DATA_TX, link))
            rx = got.get((FI_NVLINK_THROUGHPUT_DATA_RX, link))
            link_state, errors = health[link]
            ports.append(_port(link, link_state, tx_bytes=_bytes(tx), rx_bytes=_bytes(rx), errors=errors))
        return NvLink(links=tuple(ports))

    def _link_health(self, h: Any, link: int, got: dict[tuple[int, int], float]) -> Health:
        """State and error counters from the fields; a function call only for what they lack."""
        q = self.query
        field = got.get((FI_NVLINK_GET_STATE, link))
        state = int(field) if field is not None else q(N.nvmlDeviceGetNvLinkState, h, link)
        errors: dict[str, int | None] = {}
        for name, (fid, counter) in NVLINK_ERRORS.items():
            v = got.get((fid, link))
            errors[name] = int(v) if v is not None else q(N.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
        data = (
            got.get((FI_NVLINK_CRC_DATA_ERROR_COUNT[link], 0))
            if link < len(FI_NVLINK_CRC_DATA_ERROR_COUNT)
            else None
        )
        errors["crc_data"] = (
            int(data) if data is not None else q(N.nvmlDeviceGetNvLinkErrorCounter, h, link, CRC_DATA_COUNTER)
        )
        return state, {k: v for k, v in errors.items() if v is not None} or None


def _bytes(kib: float | None) -> int | None:
    return int(kib * 1024) if kib is not None else None


@register("nvlink", "NVLink state, byte counters and error counters per link", nvml=True)
def _nvlink(ctx: Context) -> NvLinkCollector:
    return NvLinkCollector(ctx)
