"""Windowed values from successive scrapes: rates, ratios and latency quantiles.

Times are Context.clock seconds, so an accelerated simulation yields rates in scenario
seconds. A window that has not yet filled uses the oldest scrape kept; a window in
which nothing happened (no request, no query) yields None: the series is absent
rather than a made-up zero. A counter that goes down means the engine restarted: the
history starts over from that scrape.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from exporter.engines.normalize import Raw
from exporter.engines.readings import QUANTILES, RATE_WINDOW_S, WINDOWS, LatencyQuantile
from exporter.metricdef import Histogram

COUNTERS = (
    "preemptions",
    "prompt_tokens",
    "generation_tokens",
    "prompt_tokens_cached",
    "rejected_requests",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "spec_decode_draft_tokens",
    "spec_decode_accepted_tokens",
    "arrivals",
    "estimated_flops_per_gpu",
    "estimated_read_bytes_per_gpu",
    "kv_transfer_failures",
    "kv_transfer_bytes",
)
MAX_POINTS = 4096
KEEP_S = max(seconds for _, seconds in WINDOWS)


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile on cumulative (upper bound, count) buckets."""
    if not buckets or not 0.0 <= q <= 1.0:
        return None
    bounds = sorted(buckets)
    if not math.isinf(bounds[-1][0]):
        return None
    total = bounds[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for i, (bound, count) in enumerate(bounds):
        if count >= rank:
            if math.isinf(bound):
                return bounds[i - 1][0] if i > 0 else None
            if i == 0 and bound <= 0:
                return bound
            lower = prev_bound if i > 0 else 0.0
            if count == prev_count:
                return bound
            return lower + (bound - lower) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return bounds[-2][0] if len(bounds) > 1 else None


def histogram_delta(new: Histogram, old: Histogram) -> Histogram:
    """Observations between two cumulative histograms; `new` whole if bounds changed."""
    old_counts = dict(old.buckets)
    if set(old_counts) != {b for b, _ in new.buckets}:
        return new
    return Histogram(
        buckets=tuple((b, c - old_counts[b]) for b, c in new.buckets),
        sum=new.sum - old.sum,
        count=new.count - old.count,
    )


@dataclass(frozen=True)
class Derived:
    prompt_tokens_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    request_rate_per_second: float | None = None
    preemptions_per_second: float | None = None
    prefix_cache_hit_ratio: float | None = None
    spec_decode_acceptance_ratio: float | None = None
    kv_transfer_latency_seconds: float | None = None
    kv_transfer_speed_bytes_per_second: float | None = None
    latency_quantiles: tuple[LatencyQuantile, ...] = ()


class ScrapeWindow:
    """The recent scrapes of one series (model, dp) of one target."""

    def __init__(self, keep_s: float = KEEP_S) -> None:
        self.keep_s = keep_s
        self.points: deque[tuple[float, Raw]] = deque()
        self.resets = 0

    def add(self, t: float, raw: Raw) -> None:
        if self.points and (t <= self.points[-1][0] - 1e-9 or _went_down(self.points[-1][1], raw)):
            self.points.clear()
            self.resets += 1
        if self.points and t == self.points[-1][0]:
            self.points.pop()
        self.points.append((t, raw))
        while len(self.points) >= 2 and self.points[1][0] <= t - self.keep_s:
            self.points.popleft()
        while len(self.points) > MAX_POINTS:
            self.points.popleft()

    def baseline(self, window_s: float) -> tuple[float, Raw] | None:
        """The newest scrape at least `window_s` old, else the oldest; None if only one."""
        if len(self.points) < 2:
            return None
        now = self.points[-1][0]
        best = self.points[0]
        for point in self.points:
            if point[0] <= now - window_s:
                best = point
            else:
                break
        return best if best[0] < now else None

    def derive(self) -> Derived:
        if not self.points:
            return Derived()
        now, cur = self.points[-1]
        quantiles = tuple(_quantiles(self, cur))
        base = self.baseline(RATE_WINDOW_S)
        if base is None:
            return Derived(latency_quantiles=quantiles)
        t0, old = base
        dt = now - t0

        def rate(name: str) -> float | None:
            a, b = old.values.get(name), cur.values.get(name)
            return None if a is None or b is None else max(b - a, 0.0) / dt

        def ratio(num: str, den: str) -> float | None:
            n, d = rate(num), rate(den)
            return None if n is None or not d else min(n / d, 1.0)

        hit = ratio("prefix_cache_hits", "prefix_cache_queries")
        if hit is None and "prefix_cache_queries" not in cur.values:
            hit = cur.values.get("prefix_hit_ratio_reported")
        accept = ratio("spec_decode_accepted_tokens", "spec_decode_draft_tokens")
        if accept is None and "spec_decode_draft_tokens" not in cur.values:
            reported = cur.values.get("spec_accept_ratio_reported")
            accept = reported if reported else None  # SGLang reports 0 without speculation
        latency, speed = _transfers(old, cur)
        return Derived(
            prompt_tokens_per_second=rate("prompt_tokens"),
            generation_tokens_per_second=rate("generation_tokens"),
            request_rate_per_second=_offered(old, cur, dt),
            preemptions_per_second=rate("preemptions"),
            prefix_cache_hit_ratio=hit,
            spec_decode_acceptance_ratio=accept,
            kv_transfer_latency_seconds=latency,
            kv_transfer_speed_bytes_per_second=speed,
            latency_quantiles=quantiles,
        )


def _went_down(old: Raw, new: Raw) -> bool:
    for name in COUNTERS:
        a, b = old.values.get(name), new.values.get(name)
        if a is not None and b is not None and b < a:
            return True
    for k, v in (old.maps.get("requests") or {}).items():
        if (new.maps.get("requests") or {}).get(k, v) < v:
            return True
    for name, h in old.hists.items():
        n = new.hists.get(name)
        if n is not None and n.count < h.count:
            return True
    return False


def _transfers(old: Raw, cur: Raw) -> tuple[float | None, float | None]:
    """KV transfer time and speed over the window: from the connector's histogram (vLLM),
    else as the engine reports them (SGLang: 0 means no transfer, so absent)."""
    new, before = cur.hists.get("kv_transfer"), old.hists.get("kv_transfer")
    if new is not None:
        d = histogram_delta(new, before) if before is not None else None
        if d is None or d.count <= 0 or d.sum <= 0:
            return None, None
        moved = cur.values.get("kv_transfer_bytes", 0.0) - old.values.get("kv_transfer_bytes", 0.0)
        return d.sum / d.count, (moved / d.sum if moved > 0 else None)
    latency, speed = (
        cur.values.get("kv_transfer_latency_reported"),
        cur.values.get("kv_transfer_speed_reported"),
    )
    return (latency or None), (speed or None)


def _offered(old: Raw, cur: Raw, dt: float) -> float | None:
    """Arrivals per second: the engine's own counter, else what left plus what piled up."""
    if "arrivals" in cur.values and "arrivals" in old.values:
        return max(cur.values["arrivals"] - old.values["arrivals"], 0.0) / dt
    done_new, done_old = cur.maps.get("requests"), old.maps.get("requests")
    if done_new is None or done_old is None:
        return None
    finished = sum(done_new.values()) - sum(done_old.values())
    rejected = cur.values.get("rejected_requests", 0.0) - old.values.get("rejected_requests", 0.0)

    def inflight(r: Raw) -> float:
        return r.values.get("requests_running", 0.0) + r.values.get("requests_waiting", 0.0)

    return max(finished + rejected + inflight(cur) - inflight(old), 0.0) / dt


def _quantiles(history: ScrapeWindow, cur: Raw) -> list[LatencyQuantile]:
    out: list[LatencyQuantile] = []
    for window, seconds in WINDOWS:
        base = history.baseline(seconds)
        deltas: Mapping[str, Histogram | None] = {
            name: (
                histogram_delta(cur.hists[name], base[1].hists[name])
                if base is not None and name in cur.hists and name in base[1].hists
                else None
            )
            for name in ("ttft", "itl")
        }
        for q in QUANTILES:
            values = {
                name: histogram_quantile(q, h.buckets) if h is not None and h.count > 0 else None
                for name, h in deltas.items()
            }
            if any(v is not None for v in values.values()):
                out.append(
                    LatencyQuantile(
                        window=window,
                        quantile=f"{q:g}",
                        ttft_seconds=values["ttft"],
                        itl_seconds=values["itl"],
                    )
                )
    return out
