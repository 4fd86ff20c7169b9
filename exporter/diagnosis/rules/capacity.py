"""Capacity: saturated GPUs, the throughput knee, and engines slow to come back from a restart."""

from __future__ import annotations

from collections.abc import Iterator
from statistics import mean

from exporter.diagnosis.fmt import value_text
from exporter.diagnosis.frame import EngineFrame, Frame
from exporter.diagnosis.history import History
from exporter.diagnosis.model import Candidate, Evidence
from exporter.diagnosis.rules.base import (
    Th,
    _live,
    _pct,
    engine_subject,
    gpu_subject,
    rule,
)


def knee_point(samples: list[tuple[float, float, float]], th: Th) -> tuple[float, float, float] | None:
    """(knee rate, tokens/s at the knee, p99 latency at low load) from (rate, tps, p99) samples.

    The samples are binned by offered rate into equal-width bins; the knee is the first
    bin after which tokens/s per extra request/s drops below `knee_slope_drop_ratio` of
    the low-load slope (the second difference turning sharply negative). None when the
    load never moved enough or throughput never stopped rising.
    """
    pts = [p for p in samples if p[0] > 0]
    if len(pts) < th.knee_min_samples:
        return None
    lo, hi = min(p[0] for p in pts), max(p[0] for p in pts)
    if hi < th.knee_min_rate_span * lo:
        return None
    width = (hi - lo) / th.knee_bins
    bins: list[list[tuple[float, float, float]]] = [[] for _ in range(th.knee_bins)]
    for p in pts:
        bins[min(th.knee_bins - 1, int((p[0] - lo) / width))].append(p)
    means = [tuple(mean(col) for col in zip(*b, strict=True)) for b in bins if len(b) >= 2]
    if len(means) < 3:
        return None
    r0, t0, l0 = means[0]
    r1, t1, _ = means[1]
    if r1 <= r0 or t1 <= t0:
        return None
    base = (t1 - t0) / (r1 - r0)
    for i in range(1, len(means) - 1):
        ri, ti, _ = means[i]
        rj, tj, _ = means[i + 1]
        if rj > ri and (tj - ti) / (rj - ri) < th.knee_slope_drop_ratio * base:
            return ri, ti, l0
    return None


def _latency(e: EngineFrame) -> float | None:
    return e.ttft_p99_seconds if e.ttft_p99_seconds is not None else e.itl_p99_seconds


@rule(
    "capacity/sm_saturation",
    severity="warning",
    scope="gpu",
    hold="sm_saturation_hold_s",
    title="GPU saturated",
    condition="SM active > sm_saturation_ratio for sm_saturation_hold_s",
    advice="The node is full: add replicas or route load elsewhere; latency will grow with any extra load.",
)
def sm_saturation(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        if g.sm_active_ratio is None or g.sm_active_ratio <= th.sm_saturation_ratio:
            continue
        yield Candidate(
            gpu_subject(g),
            (Evidence("SM active", g.sm_active_ratio, "ratio", f"> {_pct(th.sm_saturation_ratio)}"),),
            f"GPU {g.index} has no SM time left ({_pct(g.sm_active_ratio)} active)",
        )


KNEE_MAX_SAMPLES = 300


@rule(
    "capacity/throughput_knee",
    severity="warning",
    scope="engine",
    hold="knee_hold_s",
    window="rate_window_s",
    title="Past the throughput knee",
    condition=(
        "offered load at or past the rate where tokens/s stopped rising (history) while p99 TTFT >= "
        "knee_latency_jump_factor x its low-load value"
    ),
    advice="Cap the load per replica at the knee rate (autoscaling target) and add replicas beyond it.",
)
def throughput_knee(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        now_rate, now_lat = e.request_rate_per_second, _latency(e)
        if not e.up or now_rate is None or now_lat is None:
            continue
        samples = []
        frames = list(history)
        stride = max(1, len(frames) // KNEE_MAX_SAMPLES)  # the curve needs hundreds, not thousands
        for f in frames[::-stride]:
            x = f.engine(e.target)
            if x is None:
                continue
            lat = _latency(x)
            if x.request_rate_per_second is None or x.generation_tokens_per_second is None or lat is None:
                continue
            samples.append((x.request_rate_per_second, x.generation_tokens_per_second, lat))
        knee = knee_point(samples, th)
        if knee is None:
            continue
        knee_rate, knee_tps, base_lat = knee
        if now_rate < knee_rate or now_lat < th.knee_latency_jump_factor * base_lat:
            continue
        yield Candidate(
            engine_subject(e),
            (
                Evidence("offered load now", now_rate, "per_second", f">= knee {knee_rate:.2f}/s"),
                Evidence("knee (tokens/s stops rising)", knee_rate, "per_second"),
                Evidence("generated tokens/s at the knee", knee_tps, "per_second"),
                Evidence("generated tokens/s now", e.generation_tokens_per_second, "per_second"),
                Evidence("p99 latency at low load", base_lat, "seconds"),
                Evidence(
                    "p99 latency now", now_lat, "seconds", f">= {th.knee_latency_jump_factor:g}x low load"
                ),
            ),
            f"{e.name} is past its knee: {now_rate:.1f} req/s offered, throughput flat since "
            f"{knee_rate:.1f} req/s, p99 latency {now_lat / base_lat:.1f}x",
        )


@rule(
    "capacity/slow_recovery",
    severity="warning",
    scope="engine",
    hold=0.0,
    clear=0.0,
    title="Engine took long to come back",
    condition=(
        "the engine's last downtime (first failed scrape to the first good one after it) >= "
        "recovery_target_s, in the recovery_window_s since it came back"
    ),
    advice=(
        "Make restarts fast: weights on local disk or in the page cache rather than pulled from "
        "remote storage, the compile and CUDA-graph caches on a persistent volume "
        "(VLLM_CACHE_ROOT); keep a spare replica so a crash does not take capacity away."
    ),
)
def slow_recovery(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        down, back = e.last_downtime_seconds, e.recovered_at
        if not e.up or down is None or back is None:
            continue
        if frame.taken_at - back > th.recovery_window_s or down < th.recovery_target_s:
            continue
        yield Candidate(
            engine_subject(e),
            (
                Evidence(
                    "last downtime", down, "seconds", f">= {value_text(th.recovery_target_s, 'seconds')}"
                ),
                Evidence("back since", frame.taken_at - back, "seconds"),
            ),
            f"{e.name} was down for {value_text(down, 'seconds')} before it answered again",
        )
