"""PCIe: cumulative byte counters and replays from field values, link generation and width.

nvmlDeviceGetPcieThroughput is never called: it blocks about 20 ms per call. nvml.h says
the byte counters (fields 197/198) "can be wrapped", without a width: the exported
counters are formed here from the driver's, adding what each read grew by. A driver
counter that went back wrapped or was reset: what it holds now is what it counted since,
so that is added (the bytes between the last read and the wrap are lost, never invented).
The counts are kept while a GPU is down, so a GPU that comes back continues its counters.
"""

from __future__ import annotations

from typing import Any

from exporter.collectors.base import Context, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import Pcie
from exporter.nvml import FI_PCIE_COUNT_RX_BYTES, FI_PCIE_COUNT_TX_BYTES, FI_PCIE_REPLAY_COUNTER
from exporter.nvml import const as N

PCIE_FIELDS = [(FI_PCIE_COUNT_TX_BYTES, 0), (FI_PCIE_COUNT_RX_BYTES, 0), (FI_PCIE_REPLAY_COUNTER, 0)]


class PcieCollector(GpuCollector):
    name = "pcie"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._counted: dict[tuple[int, int], tuple[int, int]] = {}  # (GPU, field) -> (driver's, ours)

    def _count(self, index: int, fid: int, raw: int | None) -> int | None:
        """The exported counter: never back, never a jump, whatever the driver's did."""
        if raw is None:
            return None
        kept = self._counted.get((index, fid))
        if kept is None:
            total = raw  # what the driver counted before the exporter started
        else:
            last, total = kept
            total += raw - last if raw >= last else raw
        self._counted[(index, fid)] = (raw, total)
        return total

    def read(self, index: int, h: Any) -> Pcie:
        f = self.field_values(h, PCIE_FIELDS)
        q = self.query

        def get(i: int) -> int | None:
            v = f.get(PCIE_FIELDS[i])
            return int(v) if v is not None else None

        return Pcie(
            tx_bytes=self._count(index, FI_PCIE_COUNT_TX_BYTES, get(0)),
            rx_bytes=self._count(index, FI_PCIE_COUNT_RX_BYTES, get(1)),
            replays=get(2),
            link_generation=self.held(index, "gen", lambda: q(N.nvmlDeviceGetCurrPcieLinkGeneration, h)),
            link_width=self.held(index, "width", lambda: q(N.nvmlDeviceGetCurrPcieLinkWidth, h)),
        )


@register("pcie", "PCIe byte counters, replays and link generation/width", nvml=True)
def _pcie(ctx: Context) -> PcieCollector:
    return PcieCollector(ctx)
