"""Windowed rates, ratios and quantiles from successive scrapes."""

from __future__ import annotations

import math

import pytest

from exporter.engines.derive import ScrapeWindow, histogram_delta, histogram_quantile
from exporter.engines.normalize import Raw
from exporter.metricdef import Histogram

INF = math.inf


def hist(*counts: float, bounds: tuple[float, ...] = (0.1, 0.2, 0.4, INF)) -> Histogram:
    return Histogram(buckets=tuple(zip(bounds, counts, strict=True)), sum=0.0, count=counts[-1])


def raw(**values: float) -> Raw:
    return Raw(values=values)


def test_quantile_interpolates_inside_the_bucket_like_prometheus() -> None:
    buckets = ((0.1, 10.0), (0.2, 30.0), (0.4, 40.0), (INF, 40.0))
    # rank 20 of 40 lies halfway through (0.1, 0.2]: 10 below, 20 inside
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.15)
    # rank 39.6 lies in (0.2, 0.4]: 30 below, 10 inside -> 0.2 + 0.2 * 9.6/10
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.392)
    # the first bucket starts at 0
    assert histogram_quantile(0.1, buckets) == pytest.approx(0.04)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    assert histogram_quantile(0.99, ((0.1, 1.0), (0.2, 2.0), (INF, 10.0))) == 0.2


def test_quantile_of_nothing_is_none() -> None:
    assert histogram_quantile(0.5, ((0.1, 0.0), (INF, 0.0))) is None
    assert histogram_quantile(0.5, ()) is None
    assert histogram_quantile(0.5, ((0.1, 3.0),)) is None  # no +Inf bucket
    assert histogram_quantile(1.5, ((0.1, 3.0), (INF, 3.0))) is None


def test_delta_subtracts_bucketwise_and_survives_changed_bounds() -> None:
    d = histogram_delta(hist(5, 9, 12, 12), hist(1, 2, 2, 2))
    assert d.buckets == ((0.1, 4.0), (0.2, 7.0), (0.4, 10.0), (INF, 10.0))
    assert d.count == 10
    other = hist(1, 1, 1, bounds=(0.5, 1.0, INF))
    assert histogram_delta(other, hist(1, 2, 2, 2)) is other


def test_rates_use_the_clock_and_the_one_minute_window() -> None:
    h = ScrapeWindow()
    for t in range(0, 121, 10):  # 10 tokens/s in, 30 out
        h.add(1000.0 + t, raw(prompt_tokens=10.0 * t, generation_tokens=30.0 * t, preemptions=0.0))
    d = h.derive()
    assert d.prompt_tokens_per_second == pytest.approx(10.0)
    assert d.generation_tokens_per_second == pytest.approx(30.0)
    assert d.preemptions_per_second == 0.0


def test_a_single_scrape_derives_nothing() -> None:
    h = ScrapeWindow()
    h.add(5.0, raw(prompt_tokens=100.0))
    d = h.derive()
    assert d.prompt_tokens_per_second is None and d.latency_quantiles == ()


def test_counter_reset_starts_the_history_over() -> None:
    h = ScrapeWindow()
    h.add(0.0, raw(generation_tokens=5000.0))
    h.add(10.0, raw(generation_tokens=6000.0))
    h.add(20.0, raw(generation_tokens=50.0))  # the engine restarted
    assert h.resets == 1
    assert h.derive().generation_tokens_per_second is None
    h.add(30.0, raw(generation_tokens=150.0))
    assert h.derive().generation_tokens_per_second == pytest.approx(10.0)


def test_hit_and_acceptance_ratios_are_absent_while_idle() -> None:
    h = ScrapeWindow()
    h.add(
        0.0,
        raw(
            prefix_cache_queries=100.0,
            prefix_cache_hits=40.0,
            spec_decode_draft_tokens=90.0,
            spec_decode_accepted_tokens=30.0,
        ),
    )
    h.add(
        60.0,
        raw(
            prefix_cache_queries=300.0,
            prefix_cache_hits=140.0,
            spec_decode_draft_tokens=390.0,
            spec_decode_accepted_tokens=180.0,
        ),
    )
    d = h.derive()
    assert d.prefix_cache_hit_ratio == pytest.approx(0.5)
    assert d.spec_decode_acceptance_ratio == pytest.approx(0.5)
    h.add(
        120.0,
        raw(
            prefix_cache_queries=300.0,
            prefix_cache_hits=140.0,
            spec_decode_draft_tokens=390.0,
            spec_decode_accepted_tokens=180.0,
        ),
    )
    idle = h.derive()
    assert idle.prefix_cache_hit_ratio is None and idle.spec_decode_acceptance_ratio is None


def test_reported_ratios_stand_in_where_an_engine_has_no_counters() -> None:
    h = ScrapeWindow()
    h.add(0.0, raw(prefix_hit_ratio_reported=0.4, spec_accept_ratio_reported=0.0))
    h.add(10.0, raw(prefix_hit_ratio_reported=0.41, spec_accept_ratio_reported=0.0))
    d = h.derive()
    assert d.prefix_cache_hit_ratio == 0.41
    assert d.spec_decode_acceptance_ratio is None  # SGLang's 0 without speculation


def test_offered_rate_counts_finished_rejected_and_queue_growth() -> None:
    h = ScrapeWindow()
    h.add(
        0.0,
        Raw(
            values={"requests_running": 4, "requests_waiting": 0, "rejected_requests": 0},
            maps={"requests": {"stop": 100.0, "length": 0.0}},
        ),
    )
    h.add(
        60.0,
        Raw(
            values={"requests_running": 16, "requests_waiting": 8, "rejected_requests": 30},
            maps={"requests": {"stop": 280.0, "length": 20.0}},
        ),
    )
    # 200 finished + 30 rejected + 20 more in flight over 60 s
    assert h.derive().request_rate_per_second == pytest.approx(250 / 60)


def test_offered_rate_prefers_an_arrival_counter() -> None:
    h = ScrapeWindow()
    h.add(0.0, Raw(values={"arrivals": 10.0}, maps={"requests": {"success": 0.0}}))
    h.add(20.0, Raw(values={"arrivals": 110.0}, maps={"requests": {"success": 50.0}}))
    assert h.derive().request_rate_per_second == pytest.approx(5.0)


def test_quantiles_cover_only_the_window() -> None:
    h = ScrapeWindow()
    bounds = (0.05, 0.1, 0.5, 1.0, INF)
    # 0-300 s: 100 slow requests (0.5-1 s); 300-360 s: 100 fast ones (<= 0.05 s)
    h.add(0.0, Raw(hists={"ttft": hist(0, 0, 0, 0, 0, bounds=bounds)}))
    h.add(300.0, Raw(hists={"ttft": hist(0, 0, 0, 100, 100, bounds=bounds)}))
    h.add(360.0, Raw(hists={"ttft": hist(100, 100, 100, 200, 200, bounds=bounds)}))
    d = h.derive()
    by = {(q.window, q.quantile): q.ttft_seconds for q in d.latency_quantiles}
    assert by[("1m", "0.5")] == pytest.approx(0.025)  # fast ones only
    assert by[("5m", "0.99")] is not None and by[("5m", "0.99")] > 0.5  # slow ones still in
    assert all(q.itl_seconds is None for q in d.latency_quantiles)  # no ITL histogram


def test_quantiles_absent_when_no_request_finished_in_the_window() -> None:
    h = ScrapeWindow()
    same = hist(3, 3, 3, 3)
    h.add(0.0, Raw(hists={"ttft": same}))
    h.add(400.0, Raw(hists={"ttft": same}))
    assert h.derive().latency_quantiles == ()


def test_history_stays_bounded() -> None:
    h = ScrapeWindow()
    for t in range(5000):
        h.add(float(t), raw(prompt_tokens=float(t)))
    assert len(h.points) <= 302  # five minutes at 1 s, plus the baseline
    assert h.points[0][0] <= 4999 - 300
