"""memory/burst_headroom: the room a memory budget leaves, held to what is free."""

from __future__ import annotations

from dataclasses import replace

from exporter.diagnosis.frame import Frame
from exporter.diagnosis.rules import RULES_BY_ID
from exporter.diagnosis.thresholds import DEFAULT
from tests.support.diagnosis_builders import GIB, engine, frame, gpu, run_rule

RULE = RULES_BY_ID["memory/burst_headroom"]


def node(used_ratio: float, budgets: tuple[float | None, ...], **g: object) -> list[Frame]:
    engines = tuple(
        engine(f"http://10.0.0.{i + 1}:8000/metrics", gpus=(0,), gpu_memory_utilization=b)
        for i, b in enumerate(budgets)
    )
    return [frame(t, (gpu(0, memory_used_bytes=used_ratio * 80 * GIB, **g),), engines) for t in (0.0, 5.0)]


def fires(frames: list[Frame]) -> bool:
    return bool(run_rule(RULE, frames))


def test_fires_just_below_half_the_planned_room_and_not_just_above() -> None:
    planned = 0.3  # budget 0.7
    edge = 1 - DEFAULT.headroom_kept_min_share * planned  # used ratio at the edge: 0.85
    assert fires(node(edge + 0.005, (0.7,)))
    assert not fires(node(edge - 0.005, (0.7,)))


def test_silent_where_the_budget_leaves_no_burst_room() -> None:
    # vLLM's default 0.9 leaves 10 %: its own preallocation, not burst room; 99 % used is no finding here
    assert not fires(node(0.99, (0.9,)))
    # 0.8 leaves exactly the 20 % that makes it a plan
    assert DEFAULT.headroom_planned_min_ratio == 0.2
    assert fires(node(0.95, (0.8,)))
    assert not fires(node(0.95, (0.81,)))


def test_budgets_of_engines_sharing_a_gpu_add_up() -> None:
    assert not fires(node(0.9, (0.4, 0.5)))  # 0.9 together: 10 % left by plan
    assert fires(node(0.9, (0.3, 0.3)))  # 40 % planned, 10 % free


def test_unknown_budget_mig_and_no_engine_stay_silent() -> None:
    assert not fires(node(0.95, (None,)))
    assert not fires(node(0.95, (0.6,), mig_enabled=True))
    lone = [replace(f, engines=()) for f in node(0.95, (0.6,))]
    assert not fires(lone)


def test_evidence_names_the_room_and_what_is_free() -> None:
    (c,) = run_rule(RULE, node(0.865, (0.7,)))
    ev = {e.name: e.value for e in c.evidence}
    assert abs(ev["free memory"] - 0.135) < 1e-9  # type: ignore[operator]
    assert ev["room the budget leaves (1 - gpu_memory_utilization)"] == 0.3
    assert "14 % free of the 30 %" in c.detail
