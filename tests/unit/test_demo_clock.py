"""A simulated run says what it plays: scenario, phase, progress and the scenario's clock,
on the page, in the JSON and in the terminal report, rather than a wall-clock time."""

from __future__ import annotations

from exporter.diagnosis.report import render_text
from exporter.web.page import render_page
from exporter.web.routes import diagnosis_json

TWO_PHASES = """
name: demo
gpus: {count: 1, model: H100-80GB-SXM}
phases:
  - {name: warmup, duration: 100, gpu: {util: 0.2}}
  - {name: busy, duration: 100, gpu: {util: 0.9}}
"""


def test_the_json_carries_the_scenario_clock(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(TWO_PHASES)
    s.at(0)
    data = diagnosis_json(s.at(150))
    assert data is not None
    assert data["simulation"] == {
        "scenario": "demo",
        "phase": "busy",
        "scenario_seconds": 150.0,
        "duration_seconds": 200.0,
        "progress": 0.75,
        "speed": 1.0,
        "started_at": data["simulation"]["started_at"],
        "library_cpu_seconds": data["simulation"]["library_cpu_seconds"],
    }
    # the fake NVML library counts the CPU it spent answering the collectors' calls
    first = data["simulation"]["library_cpu_seconds"]
    later = diagnosis_json(s.at(151))
    assert later is not None and later["simulation"]["library_cpu_seconds"] > first > 0
    # the snapshot's own time is the scenario's, on the epoch it started at
    assert data["taken_at"] - data["simulation"]["started_at"] == 150.0


def test_the_page_and_the_report_say_where_the_story_is(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(TWO_PHASES)
    data = diagnosis_json(s.at(50))
    assert data is not None
    line = "scenario demo, phase warmup: 50 s of 3 min 20 s (25 %), at 1x"
    assert line in render_page(data)
    assert line in render_text(data)
    ended = diagnosis_json(s.at(260))
    assert ended is not None and "(ended: its last values hold)" in render_page(ended)


def test_a_real_node_shows_no_simulation(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(TWO_PHASES)
    data = diagnosis_json(s.at(10))
    assert data is not None
    del data["simulation"]  # what a node on real GPUs serves
    assert "scenario demo" not in render_page(data) and "snapshot " in render_page(data)
