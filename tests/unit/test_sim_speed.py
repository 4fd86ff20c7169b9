"""A scenario played fast shows every figure, and each means what it means in real time.

The stepped tests elsewhere move a manual clock; here the simulation plays in real time at
10 and 20 scenario seconds per wall second, with the runner's and the engine scraper's
own threads, as `make run` plays it. Intervals are scenario seconds (Environment.pace), so
the exporter samples the scenario as often, in the scenario's time, at any speed: energy
per token and cost per million tokens appear, rates match the timeline, a restart's
downtime is measured to about one engine interval, and a hold lasts its scenario seconds.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from exporter import app
from exporter.config import Settings
from exporter.diagnosis.diagnoser import Diagnoser
from exporter.diagnosis.model import Diagnosis, EngineEfficiencies, EngineRecoveries
from exporter.snapshot import Simulation, Snapshot

pytestmark = pytest.mark.slow  # plays scenarios in real time: `make unit` leaves it out

SCENARIO = """
name: fast-demo
description: One H100 serving a chat model; it runs hot, and its engine restarts once.
gpus: {count: 1, model: H100-80GB-SXM}
engines:
  - {name: chat, model: meta-llama/Llama-3.1-8B-Instruct, gpus: [0], num_gpu_blocks: 25000}
phases:
  - name: serving
    duration: 140
    gpu: {memory_used_ratio: 0.9, util: 0.8, sm_active: 0.6, sm_occupancy: 0.4, tensor_active: 0.4,
          dram_active: 0.5, power_ratio: 0.6, temp_c: 88, sm_clock_ratio: 0.8, throttle_sw_thermal: 1}
    engine: {request_rate: 3, running: 24, kv_usage: 0.5, prompt_tps: 6000, gen_tps: 800, ttft_s: 0.1,
             itl_s: 0.02, itl_jitter: 2.0, e2e_s: 5, api_cpu: 0.3}
faults:
  - {kind: engine_down, engine: chat, at: 20, until: 50}
"""
END_S = 130.0  # scenario seconds played


def play(tmp_path: Path, speed: float) -> tuple[Snapshot, float, list[float]]:
    """Serve the scenario at `speed` until END_S of its time: the last snapshot, the
    scenario's epoch and the times of the frames the Diagnoser keeps."""
    path = tmp_path / "fast.yaml"
    path.write_text(textwrap.dedent(SCENARIO))
    settings = Settings(
        scenario_file=str(path),
        speed=speed,
        gpu_hour_price=2.0,
        collectors_disabled=("allocator",),
    )
    exporter = app.build(settings)
    diagnoser = next(e for e in exporter.runner.enrichers if isinstance(e, Diagnoser))
    exporter.runner.start()
    try:
        deadline = time.monotonic() + END_S / speed + 20.0
        while time.monotonic() < deadline:
            published = exporter.runner.published
            sim = published.snapshot.get(Simulation) if published is not None else None
            if published is not None and sim is not None and sim.scenario_seconds >= END_S:
                return published.snapshot, sim.started_at, [f.taken_at for f in diagnoser.history]
            time.sleep(0.05)
        raise AssertionError("the scenario did not reach its end in time")
    finally:
        exporter.close()


@pytest.mark.parametrize("speed", [10.0, 20.0])
def test_every_figure_shows_and_means_the_same_at_speed(tmp_path: Path, speed: float) -> None:
    snap, epoch, frames = play(tmp_path, speed)
    diagnosis = snap.get(Diagnosis)
    assert diagnosis is not None
    # sampled as a node in real time is: about a frame per scenario second
    recent = [t for t in frames if t >= snap.taken_at - 60.0]
    assert len(recent) >= 30, f"{len(recent)} frames in the last scenario minute at {speed}x"

    effs = snap.get(EngineEfficiencies)
    assert effs is not None and effs.items, "no efficiency reading"
    eff = effs.items[0]
    assert eff.energy_per_token_joules is not None and eff.energy_per_token_joules > 0
    # 2 per GPU-hour for one GPU over 800 tokens/s: 2 / (800 x 3600) x 1e6
    assert eff.cost_per_million_tokens == pytest.approx(2.0 / (800 * 3600) * 1e6, rel=0.1)
    card = diagnosis.engines[0]
    shown = {n.name for n in card.numbers}
    assert {"energy per generated token", "cost per million tokens", "last downtime"} <= shown

    numbers = {n.name: n.value for n in card.numbers}
    assert numbers["generated tokens"] == pytest.approx(800, rel=0.1)  # a rate in scenario seconds
    # down from 20 s to 50 s: measured to about one engine interval (5 s) and a cycle
    recoveries = snap.get(EngineRecoveries)
    assert recoveries is not None and len(recoveries.items) == 1
    downtime = recoveries.items[0].last_downtime_seconds
    assert downtime is not None and 25.0 <= downtime <= 37.0, downtime
    found = {f.id: f for f in diagnosis.findings}
    assert "capacity/slow_recovery" in found
    # the thermal reason is on from the start; its one-minute hold is scenario time
    throttle = found["hardware/thermal_throttle"]
    assert 60.0 <= throttle.active_since - epoch <= 66.0, throttle.active_since - epoch
