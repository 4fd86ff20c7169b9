"""Hold and clear times: a condition must last before a finding fires, and be gone before it clears."""

from __future__ import annotations

import itertools
from dataclasses import replace

from exporter.diagnosis.diagnoser import Diagnoser, _State, step_state
from exporter.diagnosis.model import Candidate, Subject
from exporter.diagnosis.rules import RULES
from exporter.diagnosis.thresholds import DEFAULT
from tests.support.diagnosis_builders import engine, feed, frame, gpu, steady

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


def test_clears_once_the_clear_window_is_nearly_free_of_the_condition() -> None:
    on = [(float(t), True) for t in range(0, 61, 10)]
    window = max(60.0, DEFAULT.recur_s)  # a finding outlives its episode's recurrence window
    gone = 100.0 + (1 - DEFAULT.clear_max_share) * window  # sample and hold: true until 100
    assert run([*on, (100.0, False), (gone - 1, False)], 60, 60)[-1] is True
    assert run([*on, (100.0, False), (gone, False)], 60, 60)[-1] is False


def wave_every_minute(top_s: float, minutes: int = 10, step: float = 10.0) -> list[tuple[float, bool]]:
    return [(i * step, (i * step) % 60 < top_s) for i in range(int(minutes * 60 / step))]


def test_a_wave_every_minute_fires_once_and_holds() -> None:
    # the KV cache full for 15, 20 or 30 s of every minute, sampled every 10 s or every second
    for top, step in ((15.0, 10.0), (20.0, 10.0), (30.0, 10.0), (15.0, 1.0)):
        samples = wave_every_minute(top, step=step)
        states = run(samples, 120, 60)
        first = states.index(True)
        assert samples[first][0] <= 200, (top, step)
        assert all(states[first:]), (top, step)  # fired once, never cleared between waves


def test_a_wave_every_90_s_still_holds_once_fired() -> None:
    samples = [(float(t), (t % 90) < 20) for t in range(0, 1200, 5)]
    states = run(samples, 60, 60)
    first = states.index(True)
    assert all(states[first:])


def test_a_rare_spike_never_fires() -> None:
    # one 5 s sample a minute: recurring, but under hold_min_share of any hold window
    samples = [(float(t), t % 60 == 0) for t in range(0, 1200, 5)]
    assert not any(run(samples, 60, 60))
    assert not any(run(samples, 180, 60))


def test_periodic_calm_does_not_clear_but_a_long_one_does() -> None:
    samples = [(float(t), True) for t in range(0, 65, 5)]
    t = 65.0
    for _ in range(20):  # false 20 s, true 5 s: 20 % of any minute holds
        samples += [(t, False), (t + 10, False), (t + 20, True)]
        t += 25.0
    states = run(samples, 60, 60)
    assert all(states[12:])
    calm = [(t + 5.0 * i, False) for i in range(1, 20)]
    assert run([*samples, *calm], 60, 60)[-1] is False


def test_nothing_flaps_around_the_edges() -> None:
    # a storm that comes and goes for 20 minutes: fires once, clears once at the end
    samples = wave_every_minute(20.0, minutes=20, step=5.0) + [(1200.0 + 5 * i, False) for i in range(40)]
    states = run(samples, 60, 60)
    rises = sum(1 for a, b in itertools.pairwise(states) if b and not a)
    falls = sum(1 for a, b in itertools.pairwise(states) if a and not b)
    assert (rises, falls) == (1, 1)


def test_a_single_false_sample_does_not_restart_the_hold() -> None:
    samples = [(0.0, True), (30.0, True), (35.0, False), (40.0, True), (55.0, True), (60.0, True)]
    assert run(samples, 60, 60) == [False, False, False, False, False, True]


def test_a_burst_in_a_windowed_rate_does_not_fire_its_rule() -> None:
    # a 40 s burst read through a one-minute rate stays up for 100 s; the rule's hold
    # (60 s) plus its window (60 s) is longer
    d = Diagnoser()
    target = "http://e/metrics"
    seen = set()
    for t in range(0, 400, 5):
        total = 0.0 if t < 60 else min(t - 60, 40) * 1.0  # 1 rejection/s from 60 to 100
        f = frame(float(t), (gpu(0),), (engine(target, rejected_total=total),))
        _, _, diagnosis = d.step(f)
        seen |= {x.id for x in diagnosis.findings}
    assert "scheduling/admission_rejections" not in seen


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
    cool = [frame(65.0 + i * 5.0, (gpu(0),)) for i in range(int(DEFAULT.recur_s / 5) + 1)]
    values = []
    for f in cool:
        states, _, _ = d.step(f)
        values.append(next(s.active for s in states.items if s.rule == "thermal_throttle"))
    # the condition last held at 60 and, sample and hold, until 65; the finding clears
    # once at most clear_max_share of the clear window (at least recur_s) saw it
    window = max(DEFAULT.clear_s, DEFAULT.recur_s)
    gone = values.index(0)
    assert set(values[:gone]) == {1} and set(values[gone:]) == {0}
    assert cool[gone].taken_at - cool[0].taken_at >= (1 - DEFAULT.clear_max_share) * window
    assert cool[gone - 1].taken_at - cool[0].taken_at < (1 - DEFAULT.clear_max_share) * window


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
