"""Static GPU facts: name, identity, driver, NUMA placement, modes and limits.

The NUMA node is where the GPU's PCI device hangs off, and only a node with CPUs: on
Grace (GH200, GB200) nvmlDeviceGetNumaNodeId answers the node of the GPU's own memory,
which has no CPUs, so an engine pinned right would look misplaced on every GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporter.collectors.base import Context, Output, register
from exporter.collectors.gpu import GpuCollector
from exporter.gpu_readings import DeviceFacts, NvmlSession
from exporter.gpu_specs import spec_of
from exporter.nvml import const as N
from exporter.nvml import decode, function

AFFINITY_WORDS = 4  # 64-bit words of the node mask nvmlDeviceGetMemoryAffinity fills: 256 nodes


class DeviceCollector(GpuCollector):
    name = "device"
    default_interval = 60.0
    follows_interval = False

    def __init__(self, ctx: Context, sysfs: str | None = None) -> None:
        super().__init__(ctx)
        self.sysfs = Path(sysfs or ctx.sysfs)
        self._driver: str | None = None
        self._cuda: str | None = None

    def reset(self) -> None:
        super().reset()
        self._driver = self._cuda = None  # a reloaded driver may be another version

    def collect(self) -> Output:
        out = super().collect()
        return dataclasses.replace(out, node=(NvmlSession(restarts=self.nvml.restarts),))

    def _system(self) -> tuple[str, str]:
        if self._driver is None:
            q = self.query
            self._driver = decode(q(N.nvmlSystemGetDriverVersion) or "")
            cuda = q(N.nvmlSystemGetCudaDriverVersion)
            self._cuda = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else ""
        return self._driver, self._cuda or ""

    def _numa(self, h: Any, bus_id: str) -> str:
        """The first answer naming a node with CPUs: the PCI device's sysfs entry, then
        the nodes NVML calls close to the GPU, then nvmlDeviceGetNumaNodeId."""
        sources: tuple[Callable[[], list[int | None]], ...] = (
            lambda: [self._pci_node(bus_id)],
            lambda: list(self._affinity_nodes(h)),
            lambda: [self._nvml_node(h)],
        )
        for source in sources:  # asked in turn: the first answer with CPUs ends the search
            for node in source():
                if node is not None and node >= 0 and self._has_cpus(node):
                    return str(node)
        return ""

    def _pci_node(self, bus_id: str) -> int | None:
        # sysfs names the device by a 4-digit domain; NVML's bus id has 8 ("00000000:18:00.0").
        path = self.sysfs / "bus/pci/devices" / bus_id.lower()[4:] / "numa_node"
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            return None

    def _affinity_nodes(self, h: Any) -> list[int]:
        words = self.query(
            function("nvmlDeviceGetMemoryAffinity"), h, AFFINITY_WORDS, N.NVML_AFFINITY_SCOPE_NODE
        )
        if words is None:
            return []
        return [w * 64 + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1]

    def _nvml_node(self, h: Any) -> int | None:
        node = self.query(function("nvmlDeviceGetNumaNodeId"), h)
        return int(node) if node is not None else None

    def _has_cpus(self, node: int) -> bool:
        """False for CPU-less nodes (Grace's GPU memory, CXL memory) and unknown ones."""
        path = self.sysfs / "devices/system/node" / f"node{node}" / "cpulist"
        try:
            return bool(path.read_text().strip())
        except OSError:
            return False

    def read(self, index: int, h: Any) -> DeviceFacts:
        q = self.query
        driver, cuda = self._system()
        name = decode(q(N.nvmlDeviceGetName, h) or "")
        pci = q(N.nvmlDeviceGetPciInfo, h)
        bus_id = decode(pci.busId) if pci is not None else ""
        mig = q(N.nvmlDeviceGetMigMode, h)
        persistence = q(N.nvmlDeviceGetPersistenceMode, h)
        memory = q(N.nvmlDeviceGetMemoryInfo, h)
        limits = q(N.nvmlDeviceGetPowerManagementLimitConstraints, h)
        sm_max = q(N.nvmlDeviceGetMaxClockInfo, h, N.NVML_CLOCK_SM)
        mem_max = q(N.nvmlDeviceGetMaxClockInfo, h, N.NVML_CLOCK_MEM)
        spec = spec_of(name)
        labels = {
            "name": name,
            "pci_bus_id": bus_id,
            "driver_version": driver,
            "cuda_version": cuda,
            "numa_node": self._numa(h, bus_id) if bus_id else "",
            "mig_mode": "" if mig is None else ("enabled" if mig[0] else "disabled"),
            "persistence_mode": "" if persistence is None else ("enabled" if persistence else "disabled"),
        }
        return DeviceFacts(
            uuid=decode(q(N.nvmlDeviceGetUUID, h) or ""),
            labels=labels,
            memory_total_bytes=memory.total if memory is not None else None,
            sm_clock_max_hertz=sm_max * 1e6 if sm_max is not None else None,
            memory_clock_max_hertz=mem_max * 1e6 if mem_max is not None else None,
            power_limit_max_watts=limits[1] / 1000 if limits is not None else None,
            dram_bandwidth_peak_bytes_per_second=spec.dram_bandwidth_bytes_per_second if spec else None,
            pcie_link_generation_max=q(N.nvmlDeviceGetMaxPcieLinkGeneration, h),
            pcie_link_width_max=q(N.nvmlDeviceGetMaxPcieLinkWidth, h),
        )


@register("device", "GPU identity, driver, NUMA node, modes and limits (every 60 s)", nvml=True)
def _factory(ctx: Context) -> DeviceCollector:
    return DeviceCollector(ctx)
