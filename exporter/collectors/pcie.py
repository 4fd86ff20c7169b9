"""PCIe: cumulative byte counters and replays from field values, link generation and width.

nvmlDeviceGetPcieThroughput is never called: it blocks about 20 ms per call.
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

    def read(self, index: int, h: Any) -> Pcie:
        f = self.field_values(h, PCIE_FIELDS)
        q = self.query

        def get(i: int) -> int | None:
            v = f.get(PCIE_FIELDS[i])
            return int(v) if v is not None else None

        return Pcie(
            tx_bytes=get(0),
            rx_bytes=get(1),
            replays=get(2),
            link_generation=self.held(index, "gen", lambda: q(N.nvmlDeviceGetCurrPcieLinkGeneration, h)),
            link_width=self.held(index, "width", lambda: q(N.nvmlDeviceGetCurrPcieLinkWidth, h)),
        )


@register("pcie", "PCIe byte counters, replays and link generation/width", nvml=True)
def _pcie(ctx: Context) -> PcieCollector:
    return PcieCollector(ctx)
