"""Hold and clear times: a condition must last before a finding fires, and be gone before it clears."""

from __future__ import annotations

from dataclasses import replace

from test_diagnosis_builders import engine, feed, frame, gpu, steady

from exporter.diagnosis.diagnoser import Diagnoser, _State, step_state
from exporter.diagnosis.model import Candidate, Subject
from exporter.diagnosis.rules import RULES
from exporter.diagnosis.thresholds import DEFAULT

C = Candidate(Subject(gpu="0"))


def run(samples: list[tuple[float, bool]], hold: float, clear: float) -> list[bool]:
    state = _State()
    out = []
    for t, on in samples:
        step_state(state, t, C if on else None, hold, clear)
        out.append(state.active)
    return out


def test_fires_exactly_at_the_hold_time() -> None:
    assert run([(0, True), (59.9, True)], 60, 60) == [False, False]
    assert run([(0, True), (59.9, True), (60.0, True)], 60, 60)[-1] is True


def test_zero_hold_fires_on_the_first_sample() -> None:
    assert run([(0, True)], 0, 0) == [True]
    assert run([(0, True), (1, False)], 0, 0) == [True, False]


def test_clears_exactly_at_the_clear_time() -> None:
    on = [(float(t), True) for t in range(0, 61, 10)]
    off = [(100.0, False), (159.9, False)]
    assert run([*on, *off], 60, 60)[-1] is True
    assert run([*on, *off, (160.0, False)], 60, 60)[-1] is False


def test_flapping_condition_never_fires() -> None:
    # true 30 s, false 5 s, repeated for 20 minutes: never 60 s in a row
    samples = []
    t = 0.0
    while t < 1200:
        samples += [(t + s, True) for s in range(0, 30, 5)] + [(t + 30.0, False)]
        t += 35.0
    assert not any(run(samples, 60, 60))


def test_active_finding_rides_out_short_gaps() -> None:
    samples = [(float(t), True) for t in range(0, 61, 5)]
    # then flapping: false 20 s, true 5 s, false 20 s ... never 60 s false in a row
    t = 65.0
    for _ in range(20):
        samples += [(t, False), (t + 10, False), (t + 20, True)]
        t += 25.0
    assert all(run(samples, 60, 60)[12:])


def test_true_streak_restarts_after_a_single_false_sample() -> None:
    samples = [(0.0, True), (30.0, True), (35.0, False), (40.0, True), (95.0, True), (100.0, True)]
    assert run(samples, 60, 60) == [False, False, False, False, False, True]


# ---- through the Diagnoser -----------------------------------------------------------


def test_diagnoser_holds_thermal_throttle_for_its_hold_time() -> None:
    hold = DEFAULT.throttle_hold_s
    hot = steady(int(hold / 5) + 1, throttle_reasons=("hw_thermal",))  # t = 0 .. hold
    assert feed(Diagnoser(), hot[:-1]) == set()
    assert feed(Diagnoser(), hot) == {"hardware/thermal_throttle"}


def test_diagnoser_uses_snapshot_time_not_the_wall_clock() -> None:
    # the same samples fed in a burst behave exactly as if they arrived in real time
    hot = steady(13, every=10.0, throttle_reasons=("sw_thermal",))
    d = Diagnoser()
    feed(d, hot)
    assert d.latest is not None and d.latest.findings[0].active_since == hot[6].taken_at


def test_every_rule_and_subject_is_always_exported() -> None:
    gpus = (gpu(0), gpu(1))
    engines = (engine("a", gpus=(0,)), engine("b", gpus=(1,)))
    states, ratios, diagnosis = Diagnoser().step(frame(0.0, gpus, engines))
    assert diagnosis.findings == ()
    by_scope = {"gpu": 2, "engine": 2, "gpu_engine": 2}
    expected = sum(by_scope[r.scope] for r in RULES)
    assert len(states.items) == expected
    assert {s.active for s in states.items} == {0}
    keys = {(s.rule, s.gpu, s.target) for s in states.items}
    assert len(keys) == expected
    assert ("oom_risk", "0", "a") in keys and ("oom_risk", "1", "b") in keys
    assert ("thermal_throttle", "0", "") in keys and ("kv_cache_saturated", "", "a") in keys
    assert {(r.gpu, r.target) for r in ratios.items} == {("0", "a"), ("1", "b")}


def test_gpu_without_engine_gets_an_oom_series_with_empty_target() -> None:
    states, ratios, _ = Diagnoser().step(frame(0.0, (gpu(0),)))
    assert [(r.gpu, r.target) for r in ratios.items] == [("0", "")]
    assert any(s.rule == "oom_risk" and s.gpu == "0" and s.target == "" for s in states.items)


def test_finding_state_flips_to_one_and_back() -> None:
    d = Diagnoser()
    hot = steady(13, throttle_reasons=("sw_thermal",))
    feed(d, hot)
    cool = [frame(65.0 + i * 5.0, (gpu(0),)) for i in range(int(DEFAULT.clear_s / 5) + 1)]
    values = []
    for f in cool:
        states, _, _ = d.step(f)
        values.append(next(s.active for s in states.items if s.rule == "thermal_throttle"))
    assert values[0] == 1 and values[-2] == 1 and values[-1] == 0


def test_time_going_backwards_starts_over() -> None:
    d = Diagnoser()
    feed(d, steady(20, throttle_reasons=("sw_thermal",)))
    assert d.latest is not None and d.latest.findings
    _, _, diagnosis = d.step(frame(0.0, (replace(gpu(0), throttle_reasons=("sw_thermal",)),)))
    assert diagnosis.findings == ()
    assert len(d.history) == 1


def test_history_is_bounded_by_its_span() -> None:
    d = Diagnoser(history_seconds=120.0)
    feed(d, steady(100, every=5.0))
    assert len(d.history) == 25  # 120 s at 5 s, both ends included
    oldest, latest = d.history.oldest, d.history.latest
    assert oldest is not None and latest is not None
    assert latest.taken_at - oldest.taken_at == 120.0


def test_vanished_engine_drops_its_states() -> None:
    d = Diagnoser()
    d.step(frame(0.0, (gpu(0),), (engine("a", gpus=(0,)),)))
    states, _, _ = d.step(frame(5.0, (gpu(0),)))
    assert not any(s.target == "a" for s in states.items)
