"""PCIe and NVLink: cumulative byte counters from field values, replays, link state, errors.

nvmlDeviceGetPcieThroughput is never called: it blocks about 20 ms per call.
"""

from __future__ import annotations

from typing import Any

from exporter.collectors.base import Context, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import NvLink, NvLinkPort, Pcie
from exporter.nvml import NvmlError
from exporter.nvml import const as N

PCIE_FIELDS = [
    (N.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0),
    (N.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0),
    (N.NVML_FI_DEV_PCIE_REPLAY_COUNTER, 0),
]
NVLINK_ERRORS = {
    N.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
    N.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
    N.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
    N.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
}
MAX_LINKS = N.NVML_NVLINK_MAX_LINKS
# Byte counters come in one field-values call per GPU every run; state and the four error
# counters cost five calls per link (90 on an 18-link H100), so they are read every 10 runs.
SLOW_EVERY = 10


class PcieCollector(GpuCollector):
    name = "pcie"

    def read(self, index: int, h: Any) -> Pcie:
        f = self.nvml.field_values(h, PCIE_FIELDS)
        q = self.nvml.query

        def get(i: int) -> int | None:
            v = f.get(PCIE_FIELDS[i])
            return int(v) if v is not None else None

        return Pcie(
            tx_bytes=get(0),
            rx_bytes=get(1),
            replays=get(2),
            link_generation=q(N.nvmlDeviceGetCurrPcieLinkGeneration, h),
            link_width=q(N.nvmlDeviceGetCurrPcieLinkWidth, h),
        )


class NvLinkCollector(GpuCollector):
    name = "nvlink"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._links: dict[int, list[int]] = {}  # GPU -> links that answer, probed once
        self._runs: dict[int, int] = {}
        self._health: dict[int, dict[int, tuple[int | None, dict[str, int] | None]]] = {}

    def _probe(self, h: Any) -> list[int]:
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

    def read(self, index: int, h: Any) -> NvLink | None:
        if index not in self._links:
            self._links[index] = self._probe(h)
        links = self._links[index]
        if not links:
            return None
        ids = [
            (fid, link)
            for link in links
            for fid in (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)
        ]
        kib = self.nvml.field_values(h, ids)
        runs = self._runs.get(index, 0)
        self._runs[index] = runs + 1
        if runs % SLOW_EVERY == 0 or index not in self._health:
            self._health[index] = {link: self._link_health(h, link) for link in links}
        health = self._health[index]
        ports = []
        for link in links:
            tx = kib.get((N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link))
            rx = kib.get((N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link))
            up, errors = health[link]
            ports.append(
                NvLinkPort(
                    link=link,
                    up=up,
                    tx_bytes=int(tx * 1024) if tx is not None else None,
                    rx_bytes=int(rx * 1024) if rx is not None else None,
                    errors=errors,
                )
            )
        return NvLink(links=tuple(ports))

    def _link_health(self, h: Any, link: int) -> tuple[int | None, dict[str, int] | None]:
        """Link state and error counters: one call each, so read every SLOW_EVERY runs."""
        q = self.nvml.query
        errors = {name: q(N.nvmlDeviceGetNvLinkErrorCounter, h, link, c) for c, name in NVLINK_ERRORS.items()}
        return q(N.nvmlDeviceGetNvLinkState, h, link), {
            k: v for k, v in errors.items() if v is not None
        } or None


@register("pcie", "PCIe byte counters, replays and link generation/width", nvml=True)
def _pcie(ctx: Context) -> PcieCollector:
    return PcieCollector(ctx)


@register("nvlink", "NVLink state, byte counters and error counters per link", nvml=True)
def _nvlink(ctx: Context) -> NvLinkCollector:
    return NvLinkCollector(ctx)
