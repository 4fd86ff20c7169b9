"""The runner isolates collectors: a hung NVML call or a crashing collector stalls nothing else."""

from __future__ import annotations

import time

import pytest

from exporter.collectors.base import Collector, Output
from exporter.gpu_readings import Power, Utilization
from exporter.runner import Runner
from exporter.web.exposition import Exposure

pytestmark = pytest.mark.slow  # plays scenarios or starts servers: `make unit` leaves it out

HANG = """
gpus: {count: 2, model: H100-80GB-SXM}
phases: [{name: p, duration: 1000, gpu: {util: 0.5}}]
faults:
  - {kind: hang, function: nvmlDeviceGetPowerUsage, seconds: 3, at: 0, until: 1000}
"""


def test_hung_call_stalls_only_its_collector(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(HANG, interval=0.1)
    s.clock.t = 1
    s.runner.start()
    try:
        time.sleep(1.5)
        rendered = s.runner.published
        assert rendered is not None and time.monotonic() - rendered.rendered_at < 0.5  # still publishing
        snap = rendered.snapshot
        assert snap.gpu(0).get(Utilization) is not None  # other collectors kept going
        assert snap.gpu(0).get(Power) is None  # the hung one has not answered yet
        status = {c.collector: c for c in snap.collectors}
        assert status["utilization"].runs >= 5
        assert status["power"].runs == 0
    finally:
        s.runner.stop()


class Broken(Collector):
    name = "broken"
    interval_s = 0.05

    def collect(self) -> Output:
        raise RuntimeError("bug")


class Fine(Collector):
    name = "fine"
    interval_s = 0.05

    def collect(self) -> Output:
        return Output(gpus={0: (Utilization(gpu_busy_ratio=0.25),)})


def test_crashing_collector_is_counted_and_isolated() -> None:
    runner = Runner([Broken(), Fine()], interval=0.05, gpu_count=1)
    runner.start()
    try:
        time.sleep(0.5)
        snap = runner.publish().snapshot
    finally:
        runner.stop()
    status = {c.collector: c for c in snap.collectors}
    assert status["broken"].success == 0 and status["broken"].errors["RuntimeError"] >= 3
    assert status["fine"].success == 1
    assert snap.gpu(0).get(Utilization) == Utilization(gpu_busy_ratio=0.25)
    text = runner.published.text.decode()
    assert 'llmgpu_exporter_collector_success{collector="broken"} 0.0' in text
    assert 'llmgpu_gpu_utilization_ratio{gpu="0",uuid=""} 0.25' in text


class TwoGpuPower(Collector):
    name = "power"
    interval_s = 0.05

    def collect(self) -> Output:
        return Output(gpus={i: (Power(usage_watts=300.0, energy_joules=1000.0 + i),) for i in (0, 1)})


def test_a_stalled_collector_keeps_its_counters_not_its_gauges() -> None:
    # A run hung on one GPU leaves the whole collector's output ageing: counters must not
    # vanish on every GPU meanwhile (nor for the scrapes until the hung call returns).
    runner = Runner([TwoGpuPower()], interval=0.05, gpu_count=2, exposure=Exposure.of("full"))
    slot = runner._slots[0]
    runner.run_collector(slot)
    slot.completed_at = time.monotonic() - 30  # last completed run 30 s ago
    snap = runner.publish().snapshot
    for index in (0, 1):
        power = snap.gpu(index).get(Power)
        assert power is not None and power.energy_joules == 1000.0 + index
        assert power.usage_watts is None  # a 30 s old gauge is not shown
        assert snap.gpu(index).up
    text = runner.published.text.decode()
    assert 'llmgpu_gpu_energy_joules_total{gpu="1",uuid=""} 1001.0' in text
    assert "llmgpu_gpu_power_watts" not in text


def test_close_ends_every_nvml_thread_before_nvml_shutdown(sim) -> None:  # type: ignore[no-untyped-def]
    import threading

    from exporter.sim import fakenvml

    s = sim(HANG.replace("seconds: 3", "seconds: 0.3"), interval=0.05)
    s.clock.t = 1
    lib = fakenvml.installed()
    alive_at_shutdown: list[str] = []
    shutdown = lib.nvmlShutdown

    def record() -> int:
        alive_at_shutdown.extend(
            t.name
            for t in threading.enumerate()
            if t.name.startswith(("collector", "xid-events", "watchdog"))
        )
        return shutdown()

    lib.nvmlShutdown = record
    s.runner.start()
    time.sleep(0.3)  # the power collector is inside a hung call now
    s.exporter.close()
    assert alive_at_shutdown == []


def test_collectors_share_a_thread_until_one_hangs(sim, caplog) -> None:  # type: ignore[no-untyped-def]
    import threading

    s = sim(HANG, interval=0.1)
    s.clock.t = 1
    s.runner.start()
    try:
        time.sleep(1.0)
        names = [t.name for t in threading.enumerate()]
        # the hung one kept the thread it hangs in; the others went on in one new thread
        assert "collector-power" in names
        assert names.count("collectors") == 1
        assert "collector power has been in one run for over 0.1 s" in caplog.text
    finally:
        s.runner.stop()


def test_collectors_run_on_one_thread_each_on_its_own_interval() -> None:
    import threading

    class Slow(Fine):
        name = "slow"
        interval_s = 0.2

    runner = Runner([Fine(), Slow()], interval=0.05, gpu_count=1)
    runner.start()
    try:
        time.sleep(1.0)
        assert [t.name for t in threading.enumerate() if t.name.startswith("collector")] == ["collectors"]
        status = {c.collector: c for c in runner.publish().snapshot.collectors}
    finally:
        runner.stop()
    assert 15 <= status["fine"].runs <= 22  # 1 s at 0.05 s, plus the first run
    assert 4 <= status["slow"].runs <= 7
