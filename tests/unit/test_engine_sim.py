"""Simulated engines: vLLM, SGLang and TGI pages from the scenario timeline, read by the real scraper."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors.base import Context
from exporter.collectors.engines import EnginesCollector
from exporter.config import Settings
from exporter.engines.readings import Engines, EngineSeries, EngineTargetReading
from exporter.engines.scraper import EngineScraper, ScrapeConfig
from exporter.engines.targets import parse_spec
from exporter.sim.engines import SimEngine, start_sim_engines
from exporter.sim.scenario import SIM_PID_BASE, ScenarioError, Timeline, builtin_names, load_builtin, parse

pytestmark = pytest.mark.slow  # plays scenarios or starts servers: `make unit` leaves it out

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "vllm" / "vllm-0.32-cpu-loaded.txt"


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def scenario(faults: list[dict[str, object]] | None = None) -> dict[str, object]:
    return {
        "name": "t",
        "gpus": {"count": 2, "model": "H100-80GB-SXM"},
        "engines": [{"name": "e", "model": "m", "gpus": [0, 1], "num_gpu_blocks": 1234}],
        "phases": [
            {
                "name": "steady",
                "duration": 3600,
                "engine": {
                    "request_rate": 5,
                    "running": 20,
                    "waiting": 3,
                    "kv_usage": 0.6,
                    "prompt_tps": 3000,
                    "gen_tps": 900,
                    "prefix_hit_ratio": 0.25,
                    "ttft_s": 0.12,
                    "itl_s": 0.03,
                    "itl_jitter": 2.0,
                    "e2e_s": 6,
                    "api_cpu": 0.8,
                    "preemption_rate": 0.5,
                    "spec_draft_tps": 600,
                    "spec_accept_ratio": 0.7,
                    "rejection_rate": 0.2,
                },
            }
        ],
        "faults": faults or [],
    }


@pytest.fixture
def sim() -> Iterator[tuple[Clock, Timeline, SimEngine]]:
    clock = Clock()
    timeline = Timeline(
        parse(
            scenario(
                [
                    {"kind": "engine_down", "engine": "e", "at": 1000, "until": 1100},
                    {"kind": "engine_down", "engine": "e", "at": 2000, "until": 2100, "error": "refuse"},
                ]
            )
        ),
        clock=clock,
    )
    (engine,) = start_sim_engines(timeline)
    yield clock, timeline, engine
    engine.stop()


def step(scraper: EngineScraper, clock: Clock, times: range) -> EngineTargetReading:
    for t in times:
        clock.t = float(t)
        scraper.refresh()
    (target,) = scraper.readings().targets
    return target


def series(t: EngineTargetReading) -> EngineSeries:
    (s,) = t.series
    return s


def test_engine_server_identity(sim: tuple[Clock, Timeline, SimEngine]) -> None:
    _, timeline, engine = sim
    assert engine.url.startswith("http://127.0.0.1:") and engine.url.endswith("/metrics")
    assert engine.pids == tuple(sorted(timeline.scenario.engine_pids("e").values()))
    assert engine.pids[0] == SIM_PID_BASE
    target = parse_spec(engine.target_spec)
    assert target.pids == engine.pids and target.kind == "vllm" and target.url == engine.url


def test_the_page_uses_real_vllm_names_and_label_sets(sim: tuple[Clock, Timeline, SimEngine]) -> None:
    clock, _, engine = sim
    clock.t = 120.0
    page = httpx.get(engine.url, timeout=5).text

    def shapes(text: str) -> dict[str, frozenset[str]]:
        out: dict[str, frozenset[str]] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name.startswith("vllm:"):
                    out[s.name] = frozenset(s.labels)
        return out

    ours, real = shapes(page), shapes(REAL.read_text())
    shared = set(ours) & set(real)
    assert len(shared) >= 30, sorted(set(ours) - set(real))
    for name in shared:
        if name == "vllm:cache_config_info":
            assert ours[name] <= real[name]
        else:
            assert ours[name] == real[name], name
    # names only we serve are the speculative-decoding ones the CPU capture lacks
    assert {n for n in set(ours) - set(real)} <= {
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    }


def test_scraped_values_follow_the_timeline(sim: tuple[Clock, Timeline, SimEngine]) -> None:
    clock, _, engine = sim
    scraper = EngineScraper(ScrapeConfig(), [parse_spec(engine.target_spec)], clock=clock)
    t = step(scraper, clock, range(0, 601, 15))
    assert t.up and t.kind == "vllm" and t.pids == frozenset(engine.pids)
    s = series(t)
    assert (s.model, s.requests_running, s.requests_waiting, s.kv_cache_usage_ratio) == ("m", 20, 3, 0.6)
    assert s.prompt_tokens_per_second == pytest.approx(3000, rel=1e-6)
    assert s.generation_tokens_per_second == pytest.approx(900, rel=1e-6)
    assert s.preemptions_per_second == pytest.approx(0.5, rel=1e-6)
    assert s.request_rate_per_second == pytest.approx(5.2, rel=1e-3)  # 5 finished + 0.2 refused
    assert s.prefix_cache_hit_ratio == pytest.approx(0.25, rel=1e-6)
    assert s.spec_decode_acceptance_ratio == pytest.approx(0.7, rel=1e-6)
    assert s.num_gpu_blocks == 1234 and s.gpu_memory_utilization == 0.9
    # quantiles are interpolated in vLLM's buckets, as histogram_quantile does: they land
    # in the bucket that holds the timeline's value, not on it
    assert 0.1 < (s.quantile("ttft", 0.5) or 0) <= 0.25  # ttft_s 0.12
    assert 0.025 < (s.quantile("itl", 0.5) or 0) <= 0.05  # itl_s 0.03
    assert 0.05 < (s.quantile("itl", 0.99, "5m") or 0) <= 0.075  # p99 = 0.03 * itl_jitter 2
    assert (s.quantile("ttft", 0.5, "1m"), s.quantile("itl", 0.5, "1m")) == pytest.approx(
        (s.quantile("ttft", 0.5, "5m"), s.quantile("itl", 0.5, "5m")),
        rel=0.01,  # whole-request counts
    ), "a steady phase has the same quantiles over 1 and 5 minutes"
    # the API server's CPU comes from the timeline via process_cpu_seconds_total
    assert {p.role: p.cpu_ratio for p in t.processes} == {"api_server": pytest.approx(0.8)}


def test_engine_down_fault_answers_503_or_refuses_then_recovers(
    sim: tuple[Clock, Timeline, SimEngine],
) -> None:
    clock, _, engine = sim
    scraper = EngineScraper(ScrapeConfig(timeout_s=2.0), [parse_spec(engine.target_spec)], clock=clock)
    assert step(scraper, clock, range(990, 1000, 5)).up
    down = step(scraper, clock, range(1000, 1100, 50))
    assert not down.up and down.scrape_errors and down.scrape_errors["http_status"] == 2
    assert down.series == ()
    assert step(scraper, clock, range(1100, 1101)).up
    refused = step(scraper, clock, range(2000, 2001))
    assert not refused.up and refused.scrape_errors and refused.scrape_errors["connection"] == 1
    back = step(scraper, clock, range(2100, 2200, 30))
    assert back.up and series(back).generation_tokens_per_second == pytest.approx(900, rel=1e-6)


def test_accelerated_time_gives_rates_in_scenario_seconds() -> None:
    wall = Clock(1000.0)
    timeline = Timeline(parse(scenario()), speed=60.0, clock=wall)
    (engine,) = start_sim_engines(timeline)
    try:
        scraper = EngineScraper(
            ScrapeConfig(), [parse_spec(engine.target_spec)], clock=lambda: 1.7e9 + timeline.now()
        )
        for _ in range(6):  # one wall second per step = one scenario minute
            wall.t += 1.0
            scraper.refresh()
        s = series(scraper.readings().targets[0])
        assert s.generation_tokens_per_second == pytest.approx(900, rel=1e-6)
    finally:
        engine.stop()


@pytest.mark.parametrize("name", builtin_names())
def test_every_builtin_scenario_serves_parseable_engines(name: str) -> None:
    clock = Clock()
    timeline = Timeline(load_builtin(name), clock=clock)
    engines = start_sim_engines(timeline)
    try:
        assert len(engines) == len(timeline.scenario.engines)
        for t in (0.0, timeline.scenario.duration / 2, timeline.scenario.duration + 10):
            clock.t = t
            for e in engines:
                text = e.render()
                families = list(text_string_to_metric_families(text))
                values = [s.value for f in families for s in f.samples]
                assert values and all(math.isfinite(v) and v >= 0 for v in values)
    finally:
        for e in engines:
            e.stop()


def test_the_collector_steps_without_a_thread(sim: tuple[Clock, Timeline, SimEngine]) -> None:
    clock, _, engine = sim
    settings = Settings(simulate="healthy", engines=(engine.target_spec,))
    collector = EnginesCollector(Context(settings=settings, nvml=None, clock=clock))
    assert collector.name == "engines" and collector.interval_s == settings.engine_interval
    (empty,) = collector.collect().node
    assert isinstance(empty, Engines) and empty.targets == ()  # nothing scraped yet, no network
    clock.t = 10.0
    collector.refresh()
    clock.t = 70.0
    collector.refresh()
    out = collector.collect()
    (engines,) = out.node
    assert isinstance(engines, Engines)
    (t,) = engines.targets
    assert t.up and series(t).generation_tokens_per_second == pytest.approx(900, rel=1e-6)
    assert out.errors == {}


FIXTURES = ROOT / "tests" / "fixtures" / "engines"


def of_kind(kind: str, role: str = "unified", values: dict[str, float] | None = None) -> dict[str, object]:
    data = scenario()
    engine = data["engines"][0]  # type: ignore[index]
    engine.update(kind=kind, role=role)
    phase = data["phases"][0]["engine"]  # type: ignore[index]
    for key in ("api_cpu", "rejection_rate") if kind == "sglang" else ():
        del phase[key]
    if kind == "tgi":
        for key in ("api_cpu", "preemption_rate", "prefix_hit_ratio", "spec_draft_tps", "spec_accept_ratio"):
            del phase[key]
        del phase["ttft_s"]
    phase.update(values or {})
    return data


def scraped(data: dict[str, object], until: int = 600) -> tuple[EngineTargetReading, str]:
    clock = Clock()
    (engine,) = start_sim_engines(Timeline(parse(data), clock=clock))
    try:
        scraper = EngineScraper(ScrapeConfig(), [parse_spec(engine.target_spec)], clock=clock)
        return step(scraper, clock, range(0, until + 1, 15)), engine.render(float(until))
    finally:
        engine.stop()


def shapes(text: str, prefix: str) -> dict[str, frozenset[str]]:
    return {
        s.name: frozenset(s.labels)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith(prefix)
    }


@pytest.mark.parametrize(
    ("kind", "fixture", "prefix"),
    [("sglang", "sglang-0.5-tp2.txt", "sglang:"), ("tgi", "tgi-3.0-router.txt", "tgi_")],
)
def test_each_kind_serves_its_engines_names_and_label_sets(kind: str, fixture: str, prefix: str) -> None:
    t, page = scraped(of_kind(kind))
    assert t.kind == kind and t.up
    ours, real = shapes(page, prefix), shapes((FIXTURES / fixture).read_text(), prefix)
    assert set(real) <= set(ours), sorted(set(real) - set(ours))
    for name in real:
        if name.startswith("sglang:queue_time_seconds"):
            # current SGLang observes it in the scheduler (SchedulerMetricsCollector.queue_time),
            # with the scheduler's labels; the fixture has it with the tokenizer's
            assert ours[name] >= real[name], name
            continue
        # SGLang's schedulers label moe_ep_rank as well in current releases
        assert ours[name] - {"moe_ep_rank"} == real[name], name
    assert "vllm:" not in page and "process_cpu_seconds_total" not in page


def test_a_simulated_sglang_reads_like_the_timeline() -> None:
    t, page = scraped(of_kind("sglang"))
    s = series(t)
    assert (s.engine, s.model, s.requests_running, s.requests_waiting, s.kv_cache_usage_ratio) == (
        "sglang",
        "m",
        20,
        3,
        0.6,
    )
    assert s.prompt_tokens_per_second == pytest.approx(3000, rel=1e-6)
    assert s.generation_tokens_per_second == pytest.approx(900, rel=1e-6)
    assert s.preemptions_per_second == pytest.approx(0.5, rel=1e-6)  # num_retracted_requests_total
    assert s.request_rate_per_second == pytest.approx(5.0, rel=1e-3)
    assert s.prefix_cache_hit_ratio == pytest.approx(0.25)  # cache_hit_rate, as reported
    assert s.spec_decode_acceptance_ratio == pytest.approx(0.7)  # spec_accept_rate, as reported
    assert s.cache_config == {"max_total_num_tokens": str(1234 * 16)}
    assert 0.1 < (s.quantile("ttft", 0.5) or 0) <= 0.2  # ttft_s 0.12 in SGLang's buckets
    assert 0.025 < (s.quantile("itl", 0.5) or 0) <= 0.03
    # every tensor-parallel rank speaks; the normalizer reads rank 0 once
    assert page.count('sglang:num_running_reqs{model_name="m",engine_type="unified"') == 2
    # 1 + accepted drafts per step: 600 drafts x 0.7 accepted per 900 generated tokens
    (accept_length,) = {
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith("sglang:spec_accept_length{")
    }
    assert accept_length == pytest.approx(1 / (1 - 600 * 0.7 / 900))


def test_a_simulated_tgi_reads_like_the_timeline() -> None:
    t, _ = scraped(of_kind("tgi"))
    s = series(t)
    assert (s.engine, s.model, s.requests_running, s.requests_waiting) == ("tgi", None, 20, 3)
    assert s.kv_cache_usage_ratio is None and s.preemptions_per_second is None and s.ttft is None
    # token sums grow at the timeline's token rates; arrivals count the refused too
    assert s.prompt_tokens_per_second == pytest.approx(3000, rel=1e-6)
    assert s.generation_tokens_per_second == pytest.approx(900, rel=1e-6)
    assert s.request_rate_per_second == pytest.approx(5.2, rel=1e-3)
    assert s.requests is not None and s.requests["success"] == pytest.approx(3000, abs=1)
    assert 0.025 < (s.quantile("itl", 0.5) or 0) <= 0.035  # itl_s 0.03 in the router's 1.5x buckets


@pytest.mark.parametrize(
    ("engine", "values", "message"),
    [
        ({"kind": "trtllm"}, {}, "kind' must be one of vllm, sglang, tgi"),
        ({"kind": "tgi", "role": "prefill"}, {}, "role' must be one of"),
        ({"role": "both"}, {}, "role' must be one of"),
        ({"kind": "tgi"}, {"ttft_s": 0.2}, "phases.p.engine.ttft_s': the page of tgi has no metric"),
        ({"kind": "sglang"}, {"rejection_rate": 1}, "the page of sglang has no metric"),
        ({}, {"decode_transfer_queue": 3}, "the page of vllm has no metric"),
    ],
)
def test_a_scenario_is_refused_an_engine_its_page_cannot_show(
    engine: dict[str, object], values: dict[str, float], message: str
) -> None:
    data = {
        "engines": [{"name": "e", **engine}],
        "phases": [{"name": "p", "duration": 60, "engine": values}],
    }
    with pytest.raises(ScenarioError, match=message):
        parse(data)


PREFILL = {
    "kv_transfer_s": 0.4,
    "kv_transfer_gbps": 5,
    "prefill_bootstrap_queue": 7,
    "prefill_inflight_queue": 3,
    "kv_transfer_failure_rate": 0.1,
}


def test_a_disaggregated_sglang_reports_its_queues_and_transfers_on_its_own_side() -> None:
    prefill = series(scraped(of_kind("sglang", "prefill", PREFILL))[0])
    assert prefill.disagg_queue_requests == {"prefill_bootstrap": 7, "prefill_inflight": 3}
    assert prefill.kv_transfer_latency_seconds == pytest.approx(0.4)  # kv_transfer_latency_ms / 1000
    assert prefill.kv_transfer_speed_bytes_per_second == pytest.approx(5e9)  # kv_transfer_speed_gb_s
    assert prefill.kv_transfer_failures == pytest.approx(0.1 * 600, rel=1e-6)
    (decode_t, page) = scraped(
        of_kind("sglang", "decode", {"decode_prealloc_queue": 2, "decode_transfer_queue": 4})
    )
    decode = series(decode_t)
    assert decode.disagg_queue_requests == {"decode_prealloc": 2, "decode_transfer": 4}
    assert decode.kv_transfer_latency_seconds is None  # the decode scheduler sets no transfer gauge
    # SGLang exports every PD gauge in every mode, at 0 where the mode has no such queue
    assert 'sglang:num_prefill_prealloc_queue_reqs{model_name="m",engine_type="decode"' in page
    unified = series(scraped(of_kind("sglang"))[0])
    assert unified.disagg_queue_requests is None and unified.kv_transfer_latency_seconds is None


def test_a_disaggregated_vllm_reports_nixl_transfers_where_they_are_pulled() -> None:
    values = {k: PREFILL[k] for k in ("kv_transfer_s", "kv_transfer_gbps", "kv_transfer_failure_rate")}
    t, page = scraped(of_kind("vllm", "decode", values))
    decode = series(t)
    # the mean of the log-normal transfer law (median 0.4 s) over the last minute
    assert decode.kv_transfer_latency_seconds == pytest.approx(0.4 * math.exp(0.35**2 / 2), rel=0.01)
    assert decode.kv_transfer_speed_bytes_per_second == pytest.approx(5e9, rel=0.01)
    assert decode.kv_transfer_failures == pytest.approx(60, rel=1e-6)
    assert decode.kv_transfer is not None and decode.kv_transfer.count == pytest.approx(5 * 600, abs=1)
    assert "vllm:nixl_xfer_time_seconds_bucket" in page and "vllm:nixl_num_failed_notifications_total" in page
    prefill = series(scraped(of_kind("vllm", "prefill", values))[0])
    assert prefill.kv_transfer is not None and prefill.kv_transfer.count == 0
    assert prefill.kv_transfer_latency_seconds is None, "no transfer observed: no value, not 0"
    _, plain = scraped(of_kind("vllm"))
    assert "nixl" not in plain
