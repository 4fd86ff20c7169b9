"""The OOM-risk score: high usage inside the engine's budget is fine; growth beyond it is not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.diagnosis.diagnoser import Diagnoser
from exporter.diagnosis.frame import AllocFrame, Frame, MigFrame
from exporter.diagnosis.history import History
from exporter.diagnosis.model import OomRisk
from exporter.diagnosis.oom import combine, oom_risks
from exporter.diagnosis.thresholds import DEFAULT
from tests.support.diagnosis_builders import GIB, engine, feed, frame, gpu

TOTAL = 80.0 * GIB


def risks(frames: list[Frame]) -> list[OomRisk]:
    h = History(900.0)
    for f in frames:
        h.add(f)
    return oom_risks(frames[-1], h, DEFAULT)


def used(ratio: float, t: float = 0.0, budget: float | None = 0.9, **gpu_kw: object) -> Frame:
    g = replace(gpu(0), memory_used_bytes=ratio * TOTAL, memory_free_bytes=None, **gpu_kw)
    engines = (engine(gpus=(0,), gpu_memory_utilization=budget),) if budget is not None else ()
    return frame(t, (g,), engines)


def test_combine_is_a_probabilistic_or() -> None:
    assert combine([]) == 0.0
    assert combine([0.5, 0.5]) == pytest.approx(0.75)
    assert combine([1.0, 0.2]) == 1.0
    assert combine([2.0]) == 1.0


def test_vllm_preallocation_is_not_a_risk() -> None:
    (r,) = risks([used(0.9)])
    assert r.ratio == 0.0 and r.reasons == ()


def test_startup_allocation_step_is_not_a_trend() -> None:
    frames = [used(0.02, t) for t in range(0, 60, 5)] + [used(0.9, t) for t in range(60, 300, 5)]
    (r,) = risks(frames)
    assert r.ratio == 0.0


def test_usage_beyond_the_budget_tolerance_edges() -> None:
    tol = DEFAULT.oom_budget_tolerance_ratio
    (below,) = risks([used(0.9 + tol - 0.001)])
    assert below.ratio == 0.0
    (above,) = risks([used(0.9 + tol + 0.01)])
    assert above.ratio == pytest.approx((tol + 0.01) / 0.1, rel=1e-3)
    assert "beyond the engine budget" in above.reasons[0]


def test_growth_beyond_the_budget_scores_by_time_to_full() -> None:
    # 0.93 -> 0.96 over five minutes: 0.1 % of 80 GiB per 10 s
    frames = [used(0.93 + 0.03 * t / 300, t) for t in range(0, 301, 10)]
    (r,) = risks(frames)
    assert r.time_to_full_seconds == pytest.approx(0.04 * TOTAL / (0.03 * TOTAL / 300), rel=0.02)
    assert r.ratio >= DEFAULT.oom_finding_ratio
    assert any("full in about" in x for x in r.reasons)


def test_growth_inside_the_budget_is_not_scored() -> None:
    frames = [used(0.80 + 0.05 * t / 300, t) for t in range(0, 301, 10)]
    (r,) = risks(frames)
    assert r.ratio == 0.0 and r.time_to_full_seconds is None


def test_no_engine_low_headroom_edges() -> None:
    margin = DEFAULT.oom_free_margin_ratio
    (ok,) = risks([used(1 - margin, budget=None)])
    assert ok.ratio == 0.0 and ok.target == ""
    (low,) = risks([used(1 - margin + 0.001, budget=None)])
    assert low.ratio == pytest.approx(DEFAULT.oom_low_headroom_weight)


def test_a_full_kv_cache_is_no_oom_risk() -> None:
    # vLLM preallocates its KV cache: a full one preempts, it does not run out of memory
    g = replace(gpu(0), memory_used_bytes=0.9 * TOTAL)
    f = frame(0.0, (g,), (engine(gpus=(0,), kv_usage_ratio=0.99, preemptions_per_second=2.0),))
    (r,) = risks([f])
    assert r.ratio == 0.0 and r.reasons == ()


def _fragmented(pid: int, namespace: str | None, uuid: str = "GPU-0000") -> AllocFrame:
    return AllocFrame(
        pid=pid,
        free_bytes=6 * GIB,
        largest_free_block_bytes=64 * 1024**2,
        fragmentation_ratio=0.95,
        pid_namespace=namespace,
        uuid=uuid,
    )


CONTAINER_NS = "pid:[4026532000]"


def test_a_containerised_probe_joins_its_engine_across_pid_namespaces() -> None:
    # the probe says pid 7 in its container; the engine's host pid 81234 is pid 7 there
    e = engine(gpus=(0,), pids=frozenset({81234}), ns_pids=frozenset({(CONTAINER_NS, 7)}))
    g = replace(gpu(0), allocators=(_fragmented(7, CONTAINER_NS),))
    (r,) = risks([frame(0.0, (g,), (e,))])
    assert r.ratio == pytest.approx(DEFAULT.oom_fragmentation_weight)
    assert "pid 7" in r.reasons[0]


def test_a_probe_of_another_engine_on_the_gpu_is_not_counted() -> None:
    a = engine("a", gpus=(0,), pids=frozenset({81234}), ns_pids=frozenset({(CONTAINER_NS, 7)}))
    b = engine("b", gpus=(0,), pids=frozenset({90000}), ns_pids=frozenset({("pid:[4026532999]", 7)}))
    g = replace(gpu(0), allocators=(_fragmented(7, CONTAINER_NS),))
    by = {r.target: r for r in risks([frame(0.0, (g,), (a, b))])}
    assert by["a"].ratio == pytest.approx(DEFAULT.oom_fragmentation_weight)
    assert by["b"].ratio == 0.0


def test_an_unmapped_probe_joins_by_gpu_uuid_when_one_engine_runs_there() -> None:
    # /proc could not map the engine's pids (another host's pids, no permission)
    e = engine(gpus=(0,), pids=frozenset({81234}))
    g = replace(gpu(0), allocators=(_fragmented(7, CONTAINER_NS),))
    (r,) = risks([frame(0.0, (g,), (e,))])
    assert r.ratio == pytest.approx(DEFAULT.oom_fragmentation_weight)
    # two engines on the GPU: the uuid alone cannot tell whose it is
    two = (e, engine("b", gpus=(0,), pids=frozenset({90000})))
    assert all(x.ratio == 0.0 for x in risks([frame(0.0, (g,), two)]))


def test_shared_gpu_counts_outside_mig_only() -> None:
    shared = replace(gpu(0), process_count=2, process_pids=(1, 2))
    (r,) = risks([frame(0.0, (shared,))])
    assert r.ratio == pytest.approx(DEFAULT.oom_shared_weight)
    mig = replace(shared, mig_enabled=True)
    (m,) = risks([frame(0.0, (mig,))])
    assert m.ratio == 0.0


def test_mig_engine_is_judged_against_its_instance() -> None:
    inst = (
        MigFrame("MIG-a", memory_used_bytes=36 * GIB, memory_total_bytes=40 * GIB),
        MigFrame("MIG-b", memory_used_bytes=39.5 * GIB, memory_total_bytes=40 * GIB),
    )
    g = replace(gpu(0), mig_enabled=True, mig=inst, memory_used_bytes=75.5 * GIB, process_count=2)
    a = engine("a", gpus=(0,), gpu_uuids=("MIG-a",), gpu_memory_utilization=0.9)
    b = engine("b", gpus=(0,), gpu_uuids=("MIG-b",), gpu_memory_utilization=0.9)
    by_target = {r.target: r for r in risks([frame(0.0, (g,), (a, b))])}
    assert by_target["a"].ratio == 0.0
    assert by_target["b"].ratio > 0.5  # 98.75 % of its instance, budget 90 %


def test_allocator_oom_counted_is_certain_risk() -> None:
    def at(t: float, ooms: float) -> Frame:
        a = AllocFrame(pid=1000, ooms_total=ooms, free_bytes=0.0, largest_free_block_bytes=0.0)
        return frame(t, (replace(gpu(0), allocators=(a,)),), (engine(gpus=(0,)),))

    (r,) = risks([at(0.0, 0.0), at(10.0, 1.0)])
    assert r.ratio == 1.0 and "out-of-memory" in r.reasons[0]


def test_fragmentation_reason() -> None:
    a = AllocFrame(
        pid=1000, free_bytes=6 * GIB, largest_free_block_bytes=64 * 1024**2, fragmentation_ratio=0.95
    )
    (r,) = risks([frame(0.0, (replace(gpu(0), allocators=(a,)),), (engine(gpus=(0,)),))])
    assert r.ratio == pytest.approx(DEFAULT.oom_fragmentation_weight)
    assert "largest free block" in r.reasons[0]


def test_leak_becomes_a_finding_after_the_hold_time_with_evidence() -> None:
    # 0.90 -> 0.98 over ten minutes
    frames = [used(0.90 + 0.08 * min(t, 600) / 600, t) for t in range(0, 601, 5)]
    d = Diagnoser()
    assert "memory/oom_risk" in feed(d, frames)
    assert d.latest is not None
    (f,) = d.latest.findings
    assert f.subject.gpu == "0" and f.subject.target == engine().target
    names = [e.name for e in f.evidence]
    assert "time to full at the current trend" in names and "reason" in names


def test_exported_score_is_a_windowed_max_that_does_not_flap() -> None:
    # two processes share the GPU every other 10 s: the raw score flaps 0 <-> 0.3
    d = Diagnoser()
    exported, raw = [], []
    for i in range(30):
        shared = i % 2 == 0
        g = replace(gpu(0), process_count=2 if shared else 1)
        _, ratios, diagnosis = d.step(frame(i * 10.0, (g,), (engine(gpus=(0,)),)))
        exported.append(ratios.items[0].ratio)
        raw.append(diagnosis.oom_risks[0].now_ratio)
    assert set(raw) == {0.0, DEFAULT.oom_shared_weight}
    assert set(exported) == {DEFAULT.oom_shared_weight}
    # reasons of the earlier frame travel with the score, saying when
    _, _, diagnosis = d.step(frame(300.0, (gpu(0),), (engine(gpus=(0,)),)))
    assert diagnosis.oom_risks[0].ratio == DEFAULT.oom_shared_weight
    assert diagnosis.oom_risks[0].reasons[0].startswith("20 s ago: 2 processes share")
    # a whole window without the reason: the score falls
    quiet = [frame(300.0 + 10 * i, (gpu(0),), (engine(gpus=(0,)),)) for i in range(1, 8)]
    for f in quiet:
        _, ratios, _ = d.step(f)
    assert ratios.items[0].ratio == 0.0


def test_a_sudden_risk_is_exported_at_once() -> None:
    d = Diagnoser()
    d.step(frame(0.0, (gpu(0),), (engine(gpus=(0,)),)))
    _, ratios, _ = d.step(frame(10.0, (replace(gpu(0), process_count=2),), (engine(gpus=(0,)),)))
    assert ratios.items[0].ratio == DEFAULT.oom_shared_weight
