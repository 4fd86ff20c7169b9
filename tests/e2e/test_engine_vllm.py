"""The engines collector against a real vLLM server: load, kill, restart.

The collector runs as in production (its background loop, local process discovery on,
the server also configured by URL) and its readings go through the exposition renderer.
The latency quantiles it reports are checked against vLLM's own histogram, read from
vLLM's page before and after the load and interpolated here independently.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_server import VllmServer

from exporter.collectors.base import Context
from exporter.collectors.engines import EnginesCollector
from exporter.config import Settings
from exporter.engines.readings import Engines, EngineSeries, EngineTargetReading
from exporter.snapshot import Snapshot
from exporter.web.exposition import render

INTERVAL_S = 0.25
# Long enough that a scrape lands mid-load even when both cores are busy with vLLM.
MAX_TOKENS = 300


def prometheus_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """histogram_quantile() as PromQL computes it, written out for the comparison."""
    buckets = sorted(buckets)
    total = buckets[-1][1]
    rank = q * total
    below_bound, below_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return below_bound
            return below_bound + (bound - below_bound) * (rank - below_count) / (count - below_count)
        below_bound, below_count = bound, count
    raise AssertionError("unreachable")


def promtool_complaints(text: str) -> list[str]:
    """What `promtool check metrics` says about an exposition, one line per complaint."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (Debian package prometheus)"
    lint = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    return [ln for ln in (lint.stdout + lint.stderr).splitlines() if ln.strip()]


def ttft_buckets(page: str) -> dict[float, float]:
    out = {}
    for fam in text_string_to_metric_families(page):
        for s in fam.samples:
            if s.name == "vllm:time_to_first_token_seconds_bucket":
                out[float(s.labels["le"])] = s.value
    return out


def wait_for(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def collector(vllm_server: VllmServer) -> Iterator[EnginesCollector]:
    vllm_server.ensure_running()
    settings = Settings(
        engines=(f"vllm={vllm_server.metrics_url}",),
        discover_processes=True,  # finds the same server: one target, with its processes
        engine_interval=INTERVAL_S,
        engine_timeout=5.0,
    )
    c = EnginesCollector(Context(settings=settings, nvml=None))
    c.start()
    yield c
    c.stop()
    vllm_server.ensure_running()


def reading(c: EnginesCollector, vllm_server: VllmServer) -> EngineTargetReading | None:
    (engines,) = c.collect().node
    assert isinstance(engines, Engines)
    mine = [t for t in engines.targets if t.target == f"127.0.0.1:{vllm_server.port}"]
    assert len(mine) <= 1, "configured and discovered server must be one target"
    return mine[0] if mine else None


def series(t: EngineTargetReading) -> EngineSeries:
    (s,) = t.series
    return s


def test_load_kill_and_restart(vllm_server: VllmServer, collector: EnginesCollector) -> None:
    def current() -> EngineTargetReading:
        t = reading(collector, vllm_server)
        assert t is not None
        return t

    wait_for("the first good scrape", lambda: (t := reading(collector, vllm_server)) is not None and t.up, 30)
    before_page = vllm_server.metrics()
    before = series(current())
    assert before.model == "tiny" and current().kind == "vllm"
    assert before.cache_config and before.gpu_memory_utilization and before.num_gpu_blocks

    # a bounded load, watched while it runs
    seen_running: list[float] = []
    seen_kv: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            t = reading(collector, vllm_server)
            if t is not None and t.series:
                s = t.series[0]
                seen_running.append(s.requests_running or 0.0)
                seen_kv.append(s.kv_cache_usage_ratio if s.kv_cache_usage_ratio is not None else -1)
            time.sleep(INTERVAL_S / 2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    result = vllm_server.load(16, streaming=8, max_tokens=MAX_TOKENS, concurrency=4)
    load_s = time.monotonic() - started
    stop.set()
    watcher.join(5)
    assert len(result.completions) == 16 and result.completion_tokens == 16 * MAX_TOKENS

    after_page = vllm_server.metrics()
    expected_tokens = sum(
        s.value
        for f in text_string_to_metric_families(after_page)
        for s in f.samples
        if s.name == "vllm:generation_tokens_total"
    )
    wait_for(
        "the exporter to see the finished load",
        lambda: series(current()).generation_tokens == expected_tokens,
        15,
    )
    t = current()
    s = series(t)

    assert t.up
    assert s.generation_tokens is not None and before.generation_tokens is not None
    assert s.generation_tokens - before.generation_tokens == 16 * MAX_TOKENS
    assert s.generation_tokens_per_second is not None and s.generation_tokens_per_second > 0
    assert s.prompt_tokens_per_second is not None and s.prompt_tokens_per_second > 0
    assert s.request_rate_per_second is not None and s.request_rate_per_second > 0
    # vLLM's CPU build refreshes its running / KV gauges only now and then, and its
    # /metrics answers in ~1 s while it decodes, so a scrape mid-load rarely sees them
    # above 0: check that the series are there and sane, not that they caught the load.
    assert seen_running, f"no reading during a {load_s:.1f} s load"
    assert all(0 <= r <= 4 for r in seen_running)  # never above the load's concurrency
    assert s.requests_waiting is not None and s.requests_waiting >= 0
    assert all(0 <= kv <= 1 for kv in seen_kv)
    assert s.prefix_cache_hit_ratio is not None and s.prefix_cache_hit_ratio > 0  # shared prefix
    assert s.requests and sum(s.requests.values()) - sum((before.requests or {}).values()) == 16

    # TTFT quantiles = vLLM's own histogram over the same span, interpolated the PromQL way
    old, new = ttft_buckets(before_page), ttft_buckets(after_page)
    delta = [(b, new[b] - old.get(b, 0.0)) for b in new]
    assert max(c for _, c in delta) == 16  # the +Inf bucket: every request of the load
    for q in (0.5, 0.95, 0.99):
        want = prometheus_quantile(q, delta)
        for window in ("1m", "5m"):
            got = s.quantile("ttft", q, window)
            assert got == pytest.approx(want, rel=1e-9), (q, window, got, want)
        assert s.quantile("itl", q, "5m") is not None

    # the process tree: API server, engine core, worker; their CPU by role
    assert vllm_server.pid in t.pids and len(t.pids) >= 3
    roles = {p.role for p in t.processes}
    assert {"api_server", "engine_core", "worker"} <= roles, roles

    # the production rendering of it, linted
    text = render(Snapshot(taken_at=time.time(), node={Engines: collector.collect().node})).text.decode()
    ups = [s for f in text_string_to_metric_families(text) if f.name == "llmgpu_engine_up" for s in f.samples]
    assert [(u.labels["engine"], u.labels["model"], u.value) for u in ups] == [("vllm", "tiny", 1.0)]
    assert promtool_complaints(text) == []

    # killed: down within a few scrapes, the reason counted, no stale engine series
    old_pids = set(t.pids)
    vllm_server.kill()
    wait_for("up=0 after the kill", lambda: not current().up, 10)
    down = current()
    assert down.series == () and down.status[0].model == "tiny"
    # refused once it is gone; a scrape in flight at the kill ends as a broken connection
    assert down.scrape_errors and down.scrape_errors["refused"] + down.scrape_errors["connection"] >= 1
    with pytest.raises(httpx.HTTPError):
        httpx.get(vllm_server.metrics_url, timeout=2)

    # restarted on the same port: picked up again, with its new processes
    vllm_server.restart()
    wait_for("up=1 after the restart", lambda: current().up, 30)
    wait_for("the new process tree", lambda: vllm_server.pid in current().pids, 30)
    back = current()
    assert not (back.pids & old_pids)
    assert series(back).model == "tiny"
    vllm_server.complete("after restart", max_tokens=16)
    wait_for("tokens after the restart", lambda: (series(current()).generation_tokens or 0) >= 16, 15)
    rate = series(current()).generation_tokens_per_second
    assert rate is None or rate >= 0, "a counter reset never yields a negative rate"
