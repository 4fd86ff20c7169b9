"""The collector contract: every collector registers with a name, a default and whether
it needs NVML; the runner drives the lifecycle it declares."""

from __future__ import annotations

import pytest

from exporter import collectors
from exporter.collectors.base import REGISTRY, Collector, Context, Output, register
from exporter.config import Settings
from exporter.runner import Runner


def test_every_registered_collector_follows_the_contract() -> None:
    collectors.load_all()
    assert {"device", "memory", "gpm", "xid", "engines", "allocator"} <= set(REGISTRY)
    nvml = {name for name, reg in REGISTRY.items() if reg.nvml}
    assert "engines" not in nvml and "allocator" not in nvml
    assert {"device", "utilization", "memory", "clocks", "power", "gpm", "pcie", "nvlink"} <= nvml


def test_without_nvml_only_node_collectors_are_built() -> None:
    built = collectors.build(Context(settings=Settings(discover_processes=False), nvml=None))
    assert {c.name for c in built} == {name for name, reg in REGISTRY.items() if not reg.nvml}
    assert all(isinstance(c, Collector) for c in built)


def test_a_name_registered_twice_fails() -> None:
    collectors.load_all()
    with pytest.raises(ValueError, match="registered twice"):
        register("memory", "a second memory collector")(lambda ctx: Collector())


class Lifecycle(Collector):
    name = "lifecycle"
    interval_s = 60.0

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self) -> None:
        self.calls.append("start")

    def refresh(self) -> None:
        self.calls.append("refresh")

    def collect(self) -> Output:
        self.calls.append("collect")
        return Output()

    def stop(self) -> None:
        self.calls.append("stop")


def test_the_runner_calls_the_lifecycle_in_order() -> None:
    c = Lifecycle()
    runner = Runner([c], interval=60.0, gpu_count=0)
    runner.step()
    assert c.calls == ["refresh", "collect"]
    runner.start()
    runner.stop()
    assert c.calls[2] == "start" and c.calls[-1] == "stop"
