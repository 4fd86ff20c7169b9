"""Each rule at the edges of its thresholds: just below stays quiet, just above fires."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from exporter.diagnosis.diagnoser import Diagnoser
from exporter.diagnosis.frame import Frame
from exporter.diagnosis.rules import RULES, RULES_BY_ID, knee_point
from exporter.diagnosis.thresholds import DEFAULT
from tests.support.diagnosis_builders import GIB, engine, feed, frame, gpu, run_rule

TH = DEFAULT
EPS = 1e-3


def fires(rule_id: str, frames: list[Frame]) -> bool:
    return bool(run_rule(RULES_BY_ID[rule_id], frames))


def one(t: float = 0.0, **gpu_fields: Any) -> Frame:
    return frame(t, (replace(gpu(0), **gpu_fields),))


def with_engine(t: float = 0.0, gpus: tuple[Any, ...] | None = None, **engine_fields: Any) -> Frame:
    gs = gpus or (gpu(0),)
    return frame(t, gs, (engine(gpus=tuple(g.index for g in gs), **engine_fields),))


# ---- the table itself ----------------------------------------------------------------


def test_rule_ids_are_unique_layered_and_named_once() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
    names = [r.name for r in RULES]
    assert len(names) == len(set(names)), "the rule label alone must identify a rule"
    for r in RULES:
        assert r.layer in ("hardware", "kernel", "memory", "scheduling", "parallel", "decoding", "capacity")
        assert r.severity in ("critical", "warning", "info")
        assert r.advice and r.title and r.condition
        assert r.hold(TH) >= 0 and r.clear(TH) >= 0
    for layer in ("hardware", "kernel", "memory", "scheduling", "parallel", "decoding", "capacity"):
        assert any(r.layer == layer for r in RULES), layer


# ---- hardware ------------------------------------------------------------------------


def test_busy_idle_sms_edges() -> None:
    u, s = TH.busy_util_min_ratio, TH.busy_sm_active_max_ratio
    assert fires("hardware/busy_idle_sms", [one(util_ratio=u, sm_active_ratio=s - EPS)])
    assert not fires("hardware/busy_idle_sms", [one(util_ratio=u - EPS, sm_active_ratio=s - EPS)])
    assert not fires("hardware/busy_idle_sms", [one(util_ratio=u, sm_active_ratio=s)])
    # no GPM: no verdict
    assert not fires("hardware/busy_idle_sms", [one(util_ratio=1.0, sm_active_ratio=None)])


def test_dram_bandwidth_edges_and_evidence() -> None:
    d = TH.dram_bound_ratio
    assert not fires("hardware/dram_bandwidth_bound", [one(dram_active_ratio=d - EPS)])
    (c,) = run_rule(RULES_BY_ID["hardware/dram_bandwidth_bound"], [one(dram_active_ratio=d)])
    measured = next(e for e in c.evidence if e.name == "DRAM bandwidth")
    assert measured.value == pytest.approx(d * 3350e9)


def test_thermal_throttle_needs_a_thermal_reason() -> None:
    assert fires("hardware/thermal_throttle", [one(throttle_reasons=("sw_thermal",))])
    assert fires("hardware/thermal_throttle", [one(throttle_reasons=("hw_slowdown",))])
    assert not fires("hardware/thermal_throttle", [one(throttle_reasons=("sw_power_cap",))])
    assert not fires("hardware/thermal_throttle", [one(throttle_reasons=None)])


def test_power_throttle_counts_only_when_it_costs_clock() -> None:
    c = TH.power_throttle_clock_max_ratio
    assert fires("hardware/power_throttle", [one(throttle_reasons=("sw_power_cap",), sm_clock_ratio=c - EPS)])
    assert not fires("hardware/power_throttle", [one(throttle_reasons=("sw_power_cap",), sm_clock_ratio=c)])
    assert not fires("hardware/power_throttle", [one(throttle_reasons=(), sm_clock_ratio=0.5)])


def _replays(per_minute: float, span: float = 300.0, every: float = 10.0) -> list[Frame]:
    n = int(span / every) + 1
    return [one(i * every, pcie_replays_total=per_minute / 60 * i * every) for i in range(n)]


def test_pcie_replays_rate_edges() -> None:
    limit = TH.pcie_replays_per_minute
    assert fires("hardware/pcie_replays", _replays(limit * 1.05))
    assert not fires("hardware/pcie_replays", _replays(limit * 0.95))
    # a short history is not enough to call a rate
    assert not fires("hardware/pcie_replays", _replays(1000, span=30))


def test_pcie_replays_survive_a_counter_reset() -> None:
    frames = _replays(20.0)
    frames[-5:] = [
        replace(f, gpus=(replace(f.gpus[0], pcie_replays_total=i * 2.0),)) for i, f in enumerate(frames[-5:])
    ]
    assert fires("hardware/pcie_replays", frames)


def _xids(counts: list[dict[int, int]], every: float = 10.0, up: list[bool] | None = None) -> list[Frame]:
    ups = up or [True] * len(counts)
    return [one(i * every, xid_counts=c, up=u) for i, (c, u) in enumerate(zip(counts, ups, strict=True))]


def test_xid_fatal_fires_at_once_and_ages_out_after_the_window() -> None:
    seen = [{}] * 3 + [{79: 1}] * 3
    assert fires("hardware/xid_fatal", _xids(seen))
    # a GPU that fell off the bus shows no counts any more: the XID still counts
    assert fires("hardware/xid_fatal", _xids([{}, {79: 1}, {}, {}], up=[True, True, False, False]))
    # XID 31 is a memory fault, not a fatal one
    assert not fires("hardware/xid_fatal", _xids([{}] * 3 + [{31: 2}]))
    assert fires("memory/xid_memory_fault", _xids([{}] * 3 + [{31: 2}]))
    window = int(TH.xid_window_s / 10)
    assert fires("hardware/xid_fatal", _xids([{}] + [{48: 1}] * window))
    assert not fires("hardware/xid_fatal", _xids([{}] + [{48: 1}] * (window + 2)))


def test_xid_counted_since_exporter_start() -> None:
    # the exporter counts from zero, so a count in the very first frame is new
    assert fires("hardware/xid_fatal", _xids([{94: 1}]))


def test_ecc_uncorrectable_counts_growth_only() -> None:
    flat = [one(i * 10.0, ecc_uncorrected_total=7.0) for i in range(5)]
    assert not fires("hardware/ecc_uncorrectable", flat)
    grew = [*flat, one(50.0, ecc_uncorrected_total=8.0)]
    assert fires("hardware/ecc_uncorrectable", grew)
    assert fires("hardware/ecc_uncorrectable", [one(remap_failed=True)])


def test_gpu_lost() -> None:
    assert fires("hardware/gpu_lost", [one(up=False)])
    assert not fires("hardware/gpu_lost", [one()])


def test_numa_mismatch_needs_both_sides() -> None:
    g = replace(gpu(0), numa_node=1)
    assert fires("hardware/numa_mismatch", [with_engine(gpus=(g,), cpu_numa_nodes=(0,))])
    assert not fires("hardware/numa_mismatch", [with_engine(gpus=(g,), cpu_numa_nodes=(0, 1))])
    assert not fires("hardware/numa_mismatch", [with_engine(gpus=(g,), cpu_numa_nodes=None)])
    (c,) = run_rule(RULES_BY_ID["hardware/numa_mismatch"], [with_engine(gpus=(g,), cpu_numa_nodes=(0,))])
    assert c.subject.gpu == "0" and c.subject.target


# ---- kernel --------------------------------------------------------------------------


def test_low_tensor_activity_edges() -> None:
    s, t = TH.tensor_sm_active_min_ratio, TH.tensor_active_max_ratio
    assert fires("kernel/low_tensor_activity", [one(sm_active_ratio=s, tensor_active_ratio=t - EPS)])
    assert not fires("kernel/low_tensor_activity", [one(sm_active_ratio=s - EPS, tensor_active_ratio=0.0)])
    assert not fires("kernel/low_tensor_activity", [one(sm_active_ratio=0.9, tensor_active_ratio=t)])


def _mfu_frames(mfu: float, mbu: float, util: float = 0.9) -> list[Frame]:
    g = replace(gpu(0), util_ratio=util)
    flops, reads = mfu * 989e12, mbu * 3350e9
    return [
        with_engine(
            t,
            gpus=(g,),
            estimated_flops_per_gpu_total=flops * t,
            estimated_read_bytes_per_gpu_total=reads * t,
        )
        for t in (0.0, 30.0, 60.0)
    ]


def test_low_mfu_mbu_edges() -> None:
    f, b = TH.mfu_min_ratio, TH.mbu_min_ratio
    assert fires("kernel/low_mfu_mbu", _mfu_frames(f * 0.9, b * 0.9))
    assert not fires("kernel/low_mfu_mbu", _mfu_frames(f * 1.1, b * 0.9))
    assert not fires("kernel/low_mfu_mbu", _mfu_frames(f * 0.9, b * 1.1))
    assert not fires("kernel/low_mfu_mbu", _mfu_frames(0.01, 0.01, util=TH.mfu_busy_util_min_ratio - EPS))
    # no estimates exported: no verdict
    assert not fires("kernel/low_mfu_mbu", [with_engine(0.0), with_engine(60.0)])


# ---- memory --------------------------------------------------------------------------


def kv(usage: float, per_s: float) -> list[Frame]:
    """A minute of frames whose preemption counter grows `per_s` a second."""
    return [with_engine(t, kv_usage_ratio=usage, preemptions_total=per_s * t) for t in (0.0, 30.0, 60.0)]


def test_kv_cache_saturated_edges() -> None:
    k, p = TH.kv_usage_min_ratio, TH.kv_preemptions_min_per_second
    assert fires("memory/kv_cache_saturated", kv(k, p))
    assert not fires("memory/kv_cache_saturated", kv(k - EPS, 5.0))
    assert not fires("memory/kv_cache_saturated", kv(1.0, p * 0.9))


def test_kv_preemption_rate_is_the_counters_over_the_window_not_the_engines_gauge() -> None:
    # the engine's own per-second gauge says nothing here; the counter grew 0.5/s
    frames = [
        with_engine(t, kv_usage_ratio=0.99, preemptions_per_second=0.0, preemptions_total=t * 0.5)
        for t in (0.0, 30.0, 60.0)
    ]
    assert fires("memory/kv_cache_saturated", frames)
    # 30 preemptions in one burst 50 s ago still count over the minute's window
    burst = [
        with_engine(t, kv_usage_ratio=0.99, preemptions_total=0.0 if t < 10 else 30.0) for t in (0, 10, 60)
    ]
    assert fires("memory/kv_cache_saturated", burst)


def test_a_counter_read_less_often_than_frames_are_made_is_rated_at_its_scrape_times() -> None:
    # frames every 10 s, the engine scraped every 40 s: the counter moved 20 between scrapes
    # at 0 and 40 (0.5/s), but frame times would stretch that over 0..70 (0.29/s) and
    # squeeze it over 30..40
    frames = []
    for t in range(0, 80, 10):
        scraped = float(t // 40 * 40)
        frames.append(with_engine(float(t), scraped_at=scraped, rejected_total=scraped * 0.5))
    from exporter.diagnosis.history import History

    h = History(900.0)
    for f in frames:
        h.add(f)
    target = frames[0].engines[0].target
    assert h.engine_rate(target, lambda e: e.rejected_total, 60.0) == 0.5
    # sparser than the window: the newest scrape at least the window old is the start
    assert h.points(lambda f: (f.engines[0].scraped_at or 0.0, 0.0), 30.0) == [(0.0, 0.0), (40.0, 0.0)]


def test_allocator_fragmentation_false_oom_shape() -> None:
    from exporter.diagnosis.frame import AllocFrame

    req = TH.oom_typical_request_bytes

    def alloc(largest: float, free: float, frag: float) -> Frame:
        a = AllocFrame(pid=1000, free_bytes=free, largest_free_block_bytes=largest, fragmentation_ratio=frag)
        return one(allocators=(a,))

    assert fires("memory/allocator_fragmentation", [alloc(req - 1, 4 * GIB, 0.9)])
    assert not fires("memory/allocator_fragmentation", [alloc(req, 4 * GIB, 0.9)])
    assert not fires("memory/allocator_fragmentation", [alloc(req - 1, req - 1, 0.0)])  # just little free
    assert not fires(
        "memory/allocator_fragmentation", [alloc(req - 1, 4 * GIB, TH.oom_fragmentation_min_ratio - EPS)]
    )


# ---- scheduling ----------------------------------------------------------------------


def test_queue_with_idle_gpu_edges() -> None:
    idle = replace(gpu(0), sm_active_ratio=TH.queue_sm_active_max_ratio - EPS)
    busy = replace(gpu(0), sm_active_ratio=TH.queue_sm_active_max_ratio)
    w = TH.queue_waiting_min
    assert fires("scheduling/queue_with_idle_gpu", [with_engine(gpus=(idle,), waiting=w)])
    assert not fires("scheduling/queue_with_idle_gpu", [with_engine(gpus=(busy,), waiting=w)])
    assert not fires("scheduling/queue_with_idle_gpu", [with_engine(gpus=(idle,), waiting=w - 1)])
    full = with_engine(gpus=(idle,), waiting=w, kv_usage_ratio=TH.queue_kv_usage_max_ratio)
    assert not fires("scheduling/queue_with_idle_gpu", [full])
    # a draining queue is fine
    draining = [with_engine(t, gpus=(idle,), waiting=50 - t / 2) for t in (0.0, 20.0, 40.0, 60.0)]
    assert not fires("scheduling/queue_with_idle_gpu", draining)


def test_api_server_cpu_edges() -> None:
    c = TH.api_cpu_min_ratio
    assert fires("scheduling/api_server_cpu_bound", [with_engine(api_server_cpu_ratio=c)])
    assert not fires("scheduling/api_server_cpu_bound", [with_engine(api_server_cpu_ratio=c - EPS)])


def test_admission_rejections_rate_edges() -> None:
    r = TH.rejections_min_per_second

    def frames(per_s: float) -> list[Frame]:
        return [with_engine(t, rejected_total=per_s * t) for t in (0.0, 30.0, 60.0)]

    assert fires("scheduling/admission_rejections", frames(r * 1.01))
    assert not fires("scheduling/admission_rejections", frames(r * 0.99))


# ---- parallel ------------------------------------------------------------------------


def _group(*sm: float) -> tuple[Any, ...]:
    return tuple(replace(gpu(i), sm_active_ratio=v) for i, v in enumerate(sm))


def test_sm_imbalance_edges() -> None:
    s = TH.imbalance_spread_ratio
    assert fires("parallel/sm_imbalance", [with_engine(gpus=_group(0.5, 0.5, 0.5 + s))])
    assert not fires("parallel/sm_imbalance", [with_engine(gpus=_group(0.5, 0.5, 0.5 + s - EPS))])
    # an idle group is not imbalanced
    low = TH.imbalance_busiest_min_ratio - EPS
    assert not fires("parallel/sm_imbalance", [with_engine(gpus=_group(0.0, low))])
    # a single GPU has nothing to compare with
    assert not fires("parallel/sm_imbalance", [with_engine(gpus=_group(0.9))])


def test_nvlink_saturation_edges_gpm_and_counters() -> None:
    cap = 18 * TH.nvlink_link_bytes_per_second
    r = TH.nvlink_saturation_ratio
    assert fires("parallel/nvlink_saturated", [one(nvlink_tx_bytes_per_second=cap * r)])
    assert not fires("parallel/nvlink_saturated", [one(nvlink_rx_bytes_per_second=cap * r * 0.99)])
    # without GPM (A100): from the link byte counters
    cap12 = 12 * TH.nvlink_link_bytes_per_second

    def a100(per_s: float) -> list[Frame]:
        return [
            one(
                t,
                nvlink_links_up=12,
                nvlink_tx_bytes_per_second=None,
                nvlink_rx_bytes_per_second=None,
                nvlink_tx_bytes_total=per_s * t,
                nvlink_rx_bytes_total=0.0,
            )
            for t in (0.0, 30.0, 60.0)
        ]

    assert fires("parallel/nvlink_saturated", a100(cap12 * r * 1.01))
    assert not fires("parallel/nvlink_saturated", a100(cap12 * r * 0.99))


def test_tp_over_pcie() -> None:
    pcie = tuple(replace(gpu(i), nvlink_links_up=0, name="NVIDIA L4") for i in range(2))
    assert fires("parallel/tp_over_pcie", [with_engine(gpus=pcie)])
    assert not fires("parallel/tp_over_pcie", [with_engine(gpus=pcie[:1])])
    assert not fires("parallel/tp_over_pcie", [with_engine(gpus=(gpu(0), gpu(1)))])
    # unknown NVLink state: no verdict
    unknown = tuple(replace(g, nvlink_links_up=None) for g in pcie)
    assert not fires("parallel/tp_over_pcie", [with_engine(gpus=unknown)])
    # every link asleep (an idle group): NVLink is there, it wakes for traffic
    asleep = tuple(replace(gpu(i), nvlink_links_up=0, nvlink_links_sleeping=18) for i in range(2))
    assert not fires("parallel/tp_over_pcie", [with_engine(gpus=asleep)])


def test_a_sleeping_link_counts_once_in_the_nvlink_capacity() -> None:
    r = TH.nvlink_saturation_ratio
    # 16 links active and 2 asleep: 18 links of capacity, not 16 nor 20
    busy = 18 * TH.nvlink_link_bytes_per_second * r
    assert fires(
        "parallel/nvlink_saturated",
        [one(nvlink_links_up=16, nvlink_links_sleeping=2, nvlink_tx_bytes_per_second=busy)],
    )
    assert not fires(
        "parallel/nvlink_saturated",
        [one(nvlink_links_up=16, nvlink_links_sleeping=2, nvlink_tx_bytes_per_second=busy * 0.99)],
    )


# ---- decoding ------------------------------------------------------------------------


def test_spec_acceptance_edges() -> None:
    a = TH.spec_accept_min_ratio
    assert fires("decoding/low_spec_acceptance", [with_engine(spec_acceptance_ratio=a - EPS)])
    assert not fires("decoding/low_spec_acceptance", [with_engine(spec_acceptance_ratio=a)])
    assert not fires("decoding/low_spec_acceptance", [with_engine(spec_acceptance_ratio=None)])
    assert not fires("decoding/low_spec_acceptance", [with_engine(spec_acceptance_ratio=0.1, running=0.0)])


def test_itl_jitter_edges() -> None:
    j = TH.itl_jitter_factor
    assert fires("decoding/itl_jitter", [with_engine(itl_p50_seconds=0.02, itl_p99_seconds=0.02 * j)])
    assert not fires(
        "decoding/itl_jitter", [with_engine(itl_p50_seconds=0.02, itl_p99_seconds=0.02 * j * 0.99)]
    )
    assert not fires("decoding/itl_jitter", [with_engine(itl_p50_seconds=None, itl_p99_seconds=1.0)])


# ---- capacity ------------------------------------------------------------------------


def test_sm_saturation_is_strictly_above() -> None:
    s = TH.sm_saturation_ratio
    assert fires("capacity/sm_saturation", [one(sm_active_ratio=s + EPS)])
    assert not fires("capacity/sm_saturation", [one(sm_active_ratio=s)])


def _load_curve(top_rate: float, knee: float, jump: float, n: int = 120) -> list[tuple[float, float, float]]:
    """Rate ramps 1 -> top; tokens/s = 250 per req/s up to the knee, flat after; p99 jumps."""
    out = []
    for i in range(n):
        r = 1.0 + (top_rate - 1.0) * i / (n - 1)
        tps = 250.0 * min(r, knee)
        lat = 0.2 if r < knee else 0.2 * jump
        out.append((r, tps, lat))
    return out


def test_knee_point_found_where_throughput_flattens() -> None:
    found = knee_point(_load_curve(12.0, 6.0, 4.0), TH)
    assert found is not None
    rate, tps, base = found
    assert 5.0 <= rate <= 8.0 and tps == pytest.approx(250 * min(rate, 6.0), rel=0.1) and base == 0.2


def test_knee_point_none_without_a_knee_or_without_load_span() -> None:
    assert knee_point(_load_curve(12.0, 100.0, 1.0), TH) is None  # linear all the way
    assert knee_point([(4.0, 1000.0, 0.2)] * 100, TH) is None  # load never moved
    assert knee_point(_load_curve(12.0, 6.0, 4.0, n=10), TH) is None  # too few samples


def _knee_frames(jump: float, top: float = 12.0) -> list[Frame]:
    frames = []
    for i, (r, tps, lat) in enumerate(_load_curve(top, 6.0, jump)):
        frames.append(
            with_engine(
                i * 5.0,
                request_rate_per_second=r,
                generation_tokens_per_second=tps,
                ttft_p99_seconds=lat,
            )
        )
    return frames


def test_throughput_knee_needs_the_latency_jump() -> None:
    j = TH.knee_latency_jump_factor
    assert fires("capacity/throughput_knee", _knee_frames(j))
    assert not fires("capacity/throughput_knee", _knee_frames(j * 0.95))


def test_throughput_knee_quiet_below_the_knee() -> None:
    # load came back down below the knee: latency is back, no finding
    frames = _knee_frames(4.0)
    frames.append(with_engine(len(frames) * 5.0, request_rate_per_second=2.0, ttft_p99_seconds=0.2))
    assert not fires("capacity/throughput_knee", frames)


# ---- declaring rules ---------------------------------------------------------------


def test_a_rule_lives_in_the_module_of_its_layer() -> None:
    from exporter.diagnosis.rules import rule

    def check(frame: Frame, history: Any, th: Any) -> list[Any]:
        return []

    declare = rule(
        "memory/misplaced", severity="info", scope="gpu", hold=0.0, title="t", condition="c", advice="a"
    )
    with pytest.raises(ValueError, match=r"expected rules/memory\.py"):
        declare(check)


def test_a_rule_names_only_thresholds_that_exist() -> None:
    from exporter.diagnosis.rules import rule

    def check(frame: Frame, history: Any, th: Any) -> list[Any]:
        return []

    check.__module__ = "exporter.diagnosis.rules.memory"
    declare = rule(
        "memory/typo",
        severity="info",
        scope="gpu",
        hold="kv_hold_seconds",
        title="t",
        condition="c",
        advice="a",
    )
    with pytest.raises(ValueError, match="no threshold named 'kv_hold_seconds'"):
        declare(check)


def test_every_rule_is_declared_in_its_layer_module() -> None:
    for r in RULES:
        assert r.check.__module__ == f"exporter.diagnosis.rules.{r.layer}", r.id


def _finding_of(rule_id: str, frames: list[Frame]) -> Any:

    d = Diagnoser()
    for f in frames:
        _, _, diagnosis = d.step(f)
    return next(x for x in diagnosis.findings if x.id == rule_id)


def _tp_frames(gpus: tuple[Any, ...], seconds: float = 150.0) -> list[Frame]:
    return [with_engine(t, gpus=gpus) for t in range(0, int(seconds) + 1, 10)]


def test_sm_imbalance_names_the_least_busy_rank_the_others_wait_for() -> None:
    # TP-4: three ranks spin in all-reduce at 85 %, rank 3 is late at 45 %
    group = _group(0.85, 0.86, 0.84, 0.45)
    f = _finding_of("parallel/sm_imbalance", _tp_frames(group))
    assert "GPU 3" in f.detail and "GPU 3" in f.advice
    assert "busiest" not in f.advice
    ev = {e.name: e.value for e in f.evidence}
    assert ev["straggler"] == "GPU 3"
    assert ev["GPU 3 SM active"] == 0.45
    assert ev["group median SM active"] == pytest.approx(0.845)


def test_sm_imbalance_names_a_throttled_rank_even_when_it_is_the_busiest() -> None:
    # rank 1 runs at 60 % of its clock, so its share of the work takes longest
    group = tuple(
        replace(g, sm_clock_ratio=0.6, throttle_reasons=("hw_thermal",)) if g.index == 1 else g
        for g in _group(0.6, 0.95, 0.62, 0.6)
    )
    f = _finding_of("parallel/sm_imbalance", _tp_frames(group))
    ev = {e.name: e.value for e in f.evidence}
    assert ev["straggler"] == "GPU 1"
    assert ev["GPU 1 SM clock / max"] == 0.6
    assert ev["SM clock / max, median of the others"] == 0.95
    assert "GPU 1" in f.advice and "cooling" in f.advice


def test_sm_imbalance_calls_hot_ranks_at_full_clock_extra_work() -> None:
    group = _group(0.45, 0.45, 0.92, 0.45, 0.45, 0.45, 0.91, 0.45)
    f = _finding_of("parallel/sm_imbalance", _tp_frames(group))
    assert "GPU 2, GPU 6" in f.advice and "experts" in f.advice


def _queue(**engine_fields: Any) -> Any:
    idle = tuple(replace(gpu(i), sm_active_ratio=0.2) for i in range(2))
    base: dict[str, Any] = dict(waiting=40.0, running=17.0, kv_usage_ratio=0.3, api_server_cpu_ratio=0.3)
    base.update(engine_fields)
    frames = [with_engine(t, gpus=idle, **base) for t in range(0, 181, 10)]
    return _finding_of("scheduling/queue_with_idle_gpu", frames)


def test_queue_advice_does_not_raise_max_num_seqs_while_17_of_256_run() -> None:
    f = _queue(max_num_seqs=256, kv_cache_max_concurrency=120.0)
    assert "raise max_num_seqs" not in f.advice.lower()
    assert "17 of max_num_seqs 256" in f.advice and "No reported limit binds" in f.advice
    ev = {e.name: e.value for e in f.evidence}
    assert ev["running"] == 17.0 and ev["max_num_seqs"] == 256
    assert ev["KV cache holds (full-length requests)"] == 120.0


def test_queue_advice_raises_max_num_seqs_when_it_binds() -> None:
    f = _queue(running=250.0, max_num_seqs=256)
    assert "raise max_num_seqs" in f.advice


def test_queue_advice_says_what_is_unknown() -> None:
    f = _queue()
    assert "max_num_seqs unknown" in f.advice
    ev = {e.name: e.value for e in f.evidence}
    assert str(ev["max_num_seqs"]).startswith("unknown")


def test_queue_advice_names_the_api_server_or_deferred_requests() -> None:
    assert "API server" in _queue(api_server_cpu_ratio=0.97, max_num_seqs=256).advice
    assert "deferred" in _queue(waiting_deferred=30.0).advice
    assert "KV cache's 18 full-length" in _queue(kv_cache_max_concurrency=18.0).advice


def test_kv_cache_leak_edges() -> None:
    m = TH.kv_leak_min_ratio
    assert fires("memory/kv_cache_leak", [with_engine(running=0.0, waiting=0.0, kv_usage_ratio=m)])
    assert not fires("memory/kv_cache_leak", [with_engine(running=0.0, waiting=0.0, kv_usage_ratio=m - EPS)])
    # busy engines use their cache: no verdict
    assert not fires("memory/kv_cache_leak", [with_engine(running=1.0, waiting=0.0, kv_usage_ratio=0.9)])
    assert not fires("memory/kv_cache_leak", [with_engine(running=0.0, waiting=3.0, kv_usage_ratio=0.9)])


def test_builders_make_a_quiet_node() -> None:
    d = Diagnoser()
    assert feed(d, [frame(i * 5.0, (gpu(0), gpu(1)), (engine(gpus=(0, 1)),)) for i in range(60)]) == set()


def test_kv_and_admission_advice_names_the_engines_own_knobs() -> None:
    def full(kind: str) -> list[Frame]:
        return [
            with_engine(t, kind=kind, kv_usage_ratio=0.99, preemptions_total=t) for t in (0.0, 30.0, 60.0)
        ]

    (vllm,) = run_rule(RULES_BY_ID["memory/kv_cache_saturated"], full("vllm"))
    (sglang,) = run_rule(RULES_BY_ID["memory/kv_cache_saturated"], full("sglang"))
    assert vllm.advice == "" and "--schedule-conservativeness" in sglang.advice
    refusing = [with_engine(t, kind="tgi", rejected_total=t) for t in (0.0, 30.0, 60.0)]
    (tgi,) = run_rule(RULES_BY_ID["scheduling/admission_rejections"], refusing)
    assert "--max-concurrent-requests" in tgi.advice
