"""Downtime after a crash or restart: the up/down record, its metric, its finding."""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.diagnosis.diagnoser import Diagnoser
from exporter.diagnosis.frame import Frame
from exporter.diagnosis.model import EngineRecoveries
from exporter.diagnosis.recovery import Uptime, advance
from exporter.diagnosis.thresholds import DEFAULT
from exporter.sim.engines import start_sim_engines
from exporter.sim.scenario import Timeline, parse
from tests.support.diagnosis_builders import engine, feed, frame, gpu


def test_downtime_runs_from_the_first_down_sample_to_the_first_up_one() -> None:
    u = Uptime()
    for t, up in ((0, True), (5, True), (10, False), (15, False), (20, False), (52, True), (60, True)):
        u = advance(u, float(t), up)
    assert u.last_downtime_s == 42.0 and u.recovered_at == 52.0 and u.down_since is None


def test_an_engine_never_seen_up_has_no_downtime() -> None:
    u = Uptime()
    for t, up in ((0, False), (30, False), (40, True)):
        u = advance(u, float(t), up)
    assert u.last_downtime_s is None  # a start, not a recovery
    assert advance(advance(u, 50.0, False), 55.0, False).down_since == 50.0  # still down: no figure yet


def updown(downs: list[tuple[float, float]], end: float, every: float = 5.0) -> list[Frame]:
    frames = []
    t = 0.0
    while t <= end:
        up = not any(a <= t < b for a, b in downs)
        frames.append(frame(t, (gpu(0),), (engine(gpus=(0,), up=up),)))
        t += every
    return frames


def test_slow_recovery_fires_at_the_target_and_stays_for_its_window() -> None:
    target = DEFAULT.recovery_target_s
    d = Diagnoser()
    assert feed(d, updown([(100.0, 100.0 + target - 5.0)], 200.0)) == set()  # 5 s: quick enough
    d = Diagnoser()
    assert feed(d, updown([(100.0, 100.0 + target)], 200.0)) == {"capacity/slow_recovery"}
    d = Diagnoser()
    frames = updown([(100.0, 140.0)], 140.0 + DEFAULT.recovery_window_s + 10.0)
    assert feed(d, frames[: int((140.0 + DEFAULT.recovery_window_s) / 5.0)]) == {"capacity/slow_recovery"}
    assert feed(d, frames[int((140.0 + DEFAULT.recovery_window_s) / 5.0) :]) == set()  # the window passed


def test_still_down_is_no_slow_recovery_and_the_metric_waits_for_the_return() -> None:
    d = Diagnoser()
    out: tuple[object, ...] = ()
    for f in updown([(100.0, 10_000.0)], 400.0):
        out = d.readings(f)
        assert not d.latest or not d.latest.findings
    recoveries = next(x for x in out if isinstance(x, EngineRecoveries))
    assert recoveries.items == ()  # absent, not 0, while it never came back
    d = Diagnoser()
    for f in updown([(100.0, 140.0)], 150.0):
        out = d.readings(f)
    (item,) = next(x for x in out if isinstance(x, EngineRecoveries)).items
    assert item.last_downtime_seconds == 40.0
    assert d.latest is not None
    numbers = {n.name: n.value for n in d.latest.engines[0].numbers}
    assert numbers["last downtime"] == 40.0


def test_a_restarted_simulated_engine_counts_from_zero_again() -> None:
    class Clock:
        t = 0.0

        def __call__(self) -> float:
            return self.t

    clock = Clock()
    scn = parse(
        {
            "gpus": {"count": 1},
            "engines": [{"name": "e", "gpus": [0]}],
            "phases": [{"name": "p", "duration": 600, "engine": {"gen_tps": 100, "request_rate": 2}}],
            "faults": [{"kind": "engine_down", "engine": "e", "at": 200, "until": 240}],
        }
    )
    (e,) = start_sim_engines(Timeline(scn, clock=clock))
    try:
        assert "vllm:generation_tokens_total" in e.render(100.0)
        before = _counter(e.render(199.0), "vllm:generation_tokens_total")
        after = _counter(e.render(250.0), "vllm:generation_tokens_total")
        assert before == pytest.approx(19_900, rel=1e-3)
        assert after == pytest.approx(1_000, rel=1e-3)  # ten seconds since the restart at 240 s
        assert e.restarted_at(250.0) == 240.0 and e.restarted_at(230.0) is None
    finally:
        e.stop()


def _counter(page: str, name: str) -> float:
    line = next(x for x in page.splitlines() if x.startswith(name + "{"))
    return float(line.rsplit(" ", 1)[1])


def test_no_finding_for_an_engine_that_left() -> None:
    d = Diagnoser()
    frames = updown([(100.0, 140.0)], 200.0)
    feed(d, frames)
    gone = [replace(f, engines=()) for f in updown([], 30.0)]
    assert feed(d, [replace(g, taken_at=frames[-1].taken_at + 5 + i) for i, g in enumerate(gone)]) == set()
