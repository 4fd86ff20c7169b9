"""The runner isolates collectors: a hung NVML call or a crashing collector stalls nothing else."""

from __future__ import annotations

import time

from exporter.collectors.base import Collector, Output
from exporter.gpu_readings import Power, Utilization
from exporter.runner import Runner

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
