"""A counter the simulator forms is the area under its rate's track: steps and ramps."""

from __future__ import annotations

import pytest

from exporter.sim.scenario import Timeline, parse


def timeline(*phases: dict[str, object]) -> Timeline:
    return Timeline(parse({"gpus": {"count": 1}, "phases": list(phases)}))


def test_a_step_counts_from_the_moment_it_steps() -> None:
    """No replays for 10 s, then 1/s: 0 at 10 s, 5 at 15 s (not half of the quiet phase)."""
    t = timeline({"duration": 10}, {"duration": 10, "gpu": {"pcie_replay_rate": 1.0}})
    assert t.gpu_integral(0, "pcie_replay_rate", 10.0) == 0.0
    assert t.gpu_integral(0, "pcie_replay_rate", 15.0) == pytest.approx(5.0)
    assert t.gpu_integral(0, "pcie_replay_rate", 25.0) == pytest.approx(15.0)  # the last value holds


def test_a_ramp_counts_its_triangle() -> None:
    t = timeline({"duration": 10}, {"duration": 20, "ramp": 10, "gpu": {"pcie_replay_rate": 2.0}})
    assert t.gpu_integral(0, "pcie_replay_rate", 15.0) == pytest.approx(2.5)  # 5 s up to 1/s
    assert t.gpu_integral(0, "pcie_replay_rate", 20.0) == pytest.approx(10.0)
    assert t.gpu_integral(0, "pcie_replay_rate", 30.0) == pytest.approx(30.0)
