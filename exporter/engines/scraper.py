"""The engine scraper: targets, their background scrapes, and the latest readings.

Every target is scraped by its own asyncio task on its own interval, all on one event
loop in one thread; a slow or hostile target delays no other. Discovery (local
processes, Kubernetes pods) runs on that loop too, every DISCOVERY_S. Readers call
`readings()`, which only copies what the loop last published. `refresh()` runs one
round synchronously, for the stepped simulation and for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import httpx

from exporter.engines import process_tree
from exporter.engines.derive import ScrapeWindow
from exporter.engines.fetch import MAX_LABEL_LENGTH, MAX_LABELS, Limits, ScrapeError, fetch, parse
from exporter.engines.normalize import MAX_MODELS, Normalized, Raw, SeriesKey, normalize
from exporter.engines.readings import (
    SCRAPE_ERRORS,
    Engines,
    EngineSeries,
    EngineTargetReading,
    EngineUp,
    ProcessCpu,
)
from exporter.engines.targets import Target

log = logging.getLogger(__name__)

DISCOVERY_S = 30.0  # seconds between discovery rounds
TREE_REFRESH_S = 15.0  # seconds between re-reads of an engine's process tree
GRACE_S = 600.0  # a discovered target that vanished is kept (up=0) this long
MIN_WAIT_S = 0.05  # the shortest wait between two scrapes of one target, in wall seconds
# The API server's CPU from its own counter is a rate over at least this long: between two
# scrapes a second apart the counter's and the clock's jitter would be the figure.
API_CPU_WINDOW_S = 15.0


@dataclass(frozen=True)
class ScrapeConfig:
    interval_s: float = 5.0
    timeout_s: float = 3.0
    max_bytes: int = 8 * 1024 * 1024
    max_series: int = 20000
    max_labels: int = MAX_LABELS
    max_label_length: int = MAX_LABEL_LENGTH
    max_models: int = MAX_MODELS


Discoverer = Callable[[], Sequence[Target]]


@dataclass
class _State:
    """Mutable per-target state, touched only by the loop (or by refresh())."""

    target: Target
    kind: str | None
    model: str | None = None
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SCRAPE_ERRORS, 0))
    histories: dict[SeriesKey, ScrapeWindow] = field(default_factory=dict)
    series_count: int | None = None
    dropped_models: int | None = None
    tree: dict[int, str | None] = field(default_factory=dict)
    tree_at: float = -1e18  # monotonic time of the last tree read
    numa: tuple[int, ...] | None = None  # NUMA nodes of the engine's CPUs
    cpu: process_tree.CpuSampler = field(default_factory=process_tree.CpuSampler)
    # (clock, process_cpu_seconds_total) since the newest at least API_CPU_WINDOW_S old
    api_cpu: list[tuple[float, float]] = field(default_factory=list)
    missing_since: float | None = None  # monotonic, for discovered targets
    logged: str | None = None  # the state last logged: "up" or a scrape error's reason
    reading: EngineTargetReading | None = None


class EngineScraper:
    def __init__(
        self,
        config: ScrapeConfig,
        static: Iterable[Target] = (),
        discoverers: Sequence[Discoverer] = (),
        clock: Callable[[], float] = time.time,
        pace: float = 1.0,  # wall seconds per second of `clock` (1/speed in a simulation)
    ) -> None:
        self.config = config
        self.clock = clock
        self.pace = pace
        self._discoverers = tuple(discoverers)
        self._lock = threading.Lock()
        self._states: dict[str, _State] = {}
        self._static_keys: set[str] = set()
        self.discovery_errors: dict[str, int] = {}
        self._last_discovery = -1e18
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._changed: asyncio.Event | None = None  # targets came or went: start or end their loops
        for target in static:
            self.add(target)

    # ---- targets -------------------------------------------------------------------

    def add(self, target: Target) -> None:
        """A target scraped for as long as the scraper lives."""
        with self._lock:
            self._static_keys.add(target.key)
            if target.key not in self._states:
                self._states[target.key] = _State(target=target, kind=target.kind)
        self._poke()

    def _poke(self) -> None:
        """Wake the main loop (from any thread) to start or end target loops now."""
        loop, changed = self._loop, self._changed
        if loop is not None and changed is not None and loop.is_running():
            loop.call_soon_threadsafe(changed.set)

    def targets(self) -> list[Target]:
        with self._lock:
            return [s.target for s in self._states.values()]

    def _merge_discovered(self, found: Sequence[Target]) -> None:
        now = time.monotonic()
        seen = set()
        with self._lock:
            for target in found:
                seen.add(target.key)
                state = self._states.get(target.key)
                if state is None:
                    self._states[target.key] = _State(target=target, kind=target.kind)
                    continue
                state.missing_since = None
                old = state.target
                if target.key in self._static_keys:
                    # a configured target keeps its URL and type; discovery adds the process
                    merged = replace(
                        old,
                        root_pid=target.root_pid or old.root_pid,
                        pod_uid=target.pod_uid or old.pod_uid,
                        namespace=target.namespace or old.namespace,
                        pod=target.pod or old.pod,
                    )
                else:
                    merged = target
                if merged.root_pid != old.root_pid or merged.pod_uid != old.pod_uid:
                    state.tree, state.tree_at = {}, -1e18
                state.target = merged
                state.kind = old.kind or state.kind or target.kind
            for key, state in list(self._states.items()):
                if key in self._static_keys or key in seen:
                    continue
                if state.missing_since is None:
                    state.missing_since = now
                elif now - state.missing_since > GRACE_S:
                    del self._states[key]
        self._poke()

    async def _discover(self) -> None:
        if not self._discoverers:
            return
        self._last_discovery = time.monotonic()
        found: list[Target] = []
        for discoverer in self._discoverers:
            try:
                found.extend(await asyncio.to_thread(discoverer))
            except Exception as err:  # a broken discovery source must not stop scraping
                name = type(err).__name__
                self.discovery_errors[name] = self.discovery_errors.get(name, 0) + 1
                log.warning("engine discovery failed: %s", err)
                return  # keep the current targets rather than dropping them all
        self._merge_discovered(found)

    # ---- one scrape ------------------------------------------------------------------

    async def _scrape(self, state: _State, client: httpx.AsyncClient) -> None:
        target = state.target
        limits = Limits(
            timeout_s=target.timeout_s or self.config.timeout_s,
            max_bytes=self.config.max_bytes,
            max_series=self.config.max_series,
            max_labels=self.config.max_labels,
            max_label_length=self.config.max_label_length,
        )
        started = time.perf_counter()
        norm: Normalized | None = None
        error: ScrapeError | None = None
        now = self.clock()
        try:
            body = await fetch(client, target.url, limits)
            now = self.clock()  # the page's instant: before parsing, which takes a while
            families = await asyncio.to_thread(
                parse, body, limits.max_series, limits.max_labels, limits.max_label_length
            )
            del body
            norm = normalize(families, state.kind, self.config.max_models)
            if norm is None:
                raise ScrapeError("unknown_engine", "no vLLM, SGLang or TGI metric on the page")
        except ScrapeError as err:
            error = err
        except Exception as err:  # never let one target kill its task
            error = ScrapeError("connection", f"{type(err).__name__}: {err}")
        duration = time.perf_counter() - started
        if error is not None:
            now = self.clock()
        await asyncio.to_thread(self._refresh_tree, state)
        self._publish(state, norm, error, duration, now)

    def _refresh_tree(self, state: _State) -> None:
        """Find the engine's processes: given pids, the discovered root, or the port owner."""
        target = state.target
        if target.pids:  # known pids (the simulator's): nothing to inspect
            state.tree = dict.fromkeys(target.pids)
            state.numa = target.numa_nodes
            return
        mono = time.monotonic()
        root = next((p for p, r in state.tree.items() if r == "api_server"), None)
        if root is not None and mono - state.tree_at < TREE_REFRESH_S and process_tree.alive(root):
            return
        state.tree_at = mono
        pid = target.root_pid if target.root_pid and process_tree.alive(target.root_pid) else None
        if pid is None and target.pod_uid:
            pids = process_tree.pids_of_pod(target.pod_uid)
            pid = pids[0] if pids else None
        if pid is None and target.is_local:
            port = _port(target.url)
            pid = process_tree.listener_of(port) if port else None
        state.tree = process_tree.tree(pid) if pid else {}
        state.numa = process_tree.numa_nodes(state.tree) if state.tree else None

    def _process_cpu(self, state: _State, norm: Normalized | None, now: float) -> dict[str, float]:
        """CPU ratio by role: psutil where the processes are visible; otherwise (remote
        pods, the simulator's made-up pids) the API server's own process_cpu_seconds_total."""
        cpu = state.cpu.sample(state.tree, now) if state.tree else {}
        seconds = norm.process_cpu_seconds if norm is not None else None
        if seconds is not None:
            kept = state.api_cpu
            if kept and seconds < kept[-1][1]:  # the counter went back: a restart
                kept.clear()
            kept.append((now, seconds))
            while len(kept) > 2 and kept[1][0] <= now - API_CPU_WINDOW_S:
                del kept[0]
            t0, s0 = kept[0]
            if "api_server" not in cpu and now > t0:
                cpu["api_server"] = (seconds - s0) / (now - t0)
        return cpu

    def _publish(
        self,
        state: _State,
        norm: Normalized | None,
        error: ScrapeError | None,
        duration: float,
        now: float,
    ) -> None:
        series: list[EngineSeries] = []
        if error is not None:
            state.errors[error.reason] = state.errors.get(error.reason, 0) + 1
            log.debug("engine %s: %s", state.target.url, error)
        elif norm is not None:
            state.kind = state.kind or norm.kind
            state.series_count = norm.samples
            state.dropped_models = norm.dropped_models
            for key in [k for k in state.histories if k not in norm.series]:
                del state.histories[key]
            for key, raw in sorted(norm.series.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
                history = state.histories.setdefault(key, ScrapeWindow())
                history.add(now, raw)
                series.append(_series(norm.kind, key, raw, history))
            models = sorted({m for (m, _) in norm.series if m})
            if models:
                state.model = models[0]
        _log_change(state, error)
        cpu = self._process_cpu(state, norm, now)
        reading = EngineTargetReading(
            target=state.target.name,
            status=(EngineUp(engine=state.kind or "unknown", model=state.model, up=0 if error else 1),),
            scrape_duration_seconds=duration,
            scrape_errors=dict(state.errors),
            series_count=state.series_count,
            dropped_models=state.dropped_models,
            processes=tuple(ProcessCpu(role=r, cpu_ratio=v) for r, v in sorted(cpu.items())),
            series=tuple(series),
            url=state.target.url,
            kind=state.kind,
            source=state.target.source,
            pids=frozenset(state.tree),
            cpu_numa_nodes=state.numa,
            max_num_seqs=state.target.max_num_seqs,
            max_num_batched_tokens=state.target.max_num_batched_tokens,
            last_error=str(error) if error else None,
            scraped_at=now if error is None else (state.reading.scraped_at if state.reading else None),
        )
        with self._lock:
            state.reading = reading

    # ---- reading -----------------------------------------------------------------------

    def readings(self) -> Engines:
        with self._lock:
            found = [s.reading for s in self._states.values() if s.reading is not None]
        return Engines(targets=tuple(sorted(found, key=lambda r: (r.target, r.url))))

    # ---- running -----------------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        # trust_env=False: an HTTP(S)_PROXY meant for the outside must not catch node-local
        # scrapes; redirects are not followed (a /metrics that redirects is misconfigured).
        return httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=None)

    async def _round(self, client: httpx.AsyncClient | None = None, discover: bool = False) -> None:
        if discover or time.monotonic() - self._last_discovery >= DISCOVERY_S:
            await self._discover()
        with self._lock:
            states = list(self._states.values())
        if not states:
            return  # making a client loads the CA bundle (~20 ms): not for nothing to scrape
        own = client is None
        http = self._client() if client is None else client
        try:
            await asyncio.gather(*(self._scrape(s, http) for s in states))
        finally:
            if own:
                await http.aclose()

    def refresh(self, *, discover: bool = False) -> None:
        """One scrape of every current target, after discovery when due (or asked for);
        returns when done."""
        loop = self._loop
        if loop is not None and loop.is_running():
            future: Future[None] = asyncio.run_coroutine_threadsafe(self._round(discover=discover), loop)
            future.result()
        else:
            asyncio.run(self._round(discover=discover))

    def start(self) -> None:
        if self._thread is not None:
            return
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="engine-scraper", daemon=True)
        self._thread.start()
        ready.wait(5.0)

    def stop(self, timeout_s: float = 5.0) -> None:
        loop, stopping, thread = self._loop, self._stopping, self._thread
        if loop is not None and stopping is not None and loop.is_running():
            loop.call_soon_threadsafe(stopping.set)
            self._poke()
        if thread is not None:
            thread.join(timeout_s)
        self._thread = None

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(ready))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            self._loop = None

    async def _main(self, ready: threading.Event) -> None:
        self._stopping = asyncio.Event()
        self._changed = asyncio.Event()
        ready.set()
        tasks: dict[str, asyncio.Task[None]] = {}
        async with self._client() as client:
            try:
                while not self._stopping.is_set():
                    if time.monotonic() - self._last_discovery >= DISCOVERY_S:
                        await self._discover()
                    with self._lock:
                        current = dict(self._states)
                    for key in current:
                        if key not in tasks or tasks[key].done():
                            tasks[key] = asyncio.create_task(self._target_loop(key, client))
                    for key in [k for k in tasks if k not in current]:
                        tasks.pop(key).cancel()
                    # Targets change only at discovery or through add(), which wake this
                    # early: a node without engines does not tick.
                    due = self._last_discovery + DISCOVERY_S if self._discoverers else None
                    await _wait(self._changed, None if due is None else max(0.05, due - time.monotonic()))
                    self._changed.clear()
            finally:
                for task in tasks.values():
                    task.cancel()
                await asyncio.gather(*tasks.values(), return_exceptions=True)

    async def _target_loop(self, key: str, client: httpx.AsyncClient) -> None:
        assert self._stopping is not None
        while not self._stopping.is_set():
            with self._lock:
                state = self._states.get(key)
            if state is None:
                return
            started = time.monotonic()
            await self._scrape(state, client)
            # an interval is seconds of `clock`: a scenario played fast is scraped as often
            # in its own time as a real engine is
            interval = (state.target.interval_s or self.config.interval_s) * self.pace
            await _wait(self._stopping, max(interval - (time.monotonic() - started), MIN_WAIT_S))


async def _wait(event: asyncio.Event, seconds: float | None) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=seconds)


def _log_change(state: _State, error: ScrapeError | None) -> None:
    """One log line when a target goes down (with the reason), comes back, or fails for
    another reason; a target found up at its first scrape is no news."""
    now = "up" if error is None else error.reason
    if now == state.logged:
        return
    first = state.logged is None
    state.logged = now
    if error is None:
        log.log(
            logging.DEBUG if first else logging.INFO,
            "engine target %s is up (%s)",
            state.target.url,
            state.kind or "engine kind unknown yet",
        )
    else:
        log.warning("engine target %s is down: %s", state.target.url, error)


def _port(url: str) -> int | None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


def _series(kind: str, key: SeriesKey, raw: Raw, history: ScrapeWindow) -> EngineSeries:
    model, dp = key
    d = history.derive()
    v = raw.values
    return EngineSeries(
        engine=kind,
        model=model,
        dp=dp,
        requests_running=v.get("requests_running"),
        requests_waiting=v.get("requests_waiting"),
        requests_waiting_by_reason=_opt(raw.maps.get("requests_waiting_by_reason")),
        kv_cache_usage_ratio=v.get("kv_cache_usage_ratio"),
        preemptions=v.get("preemptions"),
        estimated_flops_per_gpu=v.get("estimated_flops_per_gpu"),
        estimated_read_bytes_per_gpu=v.get("estimated_read_bytes_per_gpu"),
        prompt_tokens=v.get("prompt_tokens"),
        generation_tokens=v.get("generation_tokens"),
        prompt_tokens_cached=v.get("prompt_tokens_cached"),
        requests=_opt(raw.maps.get("requests")),
        rejected_requests=v.get("rejected_requests"),
        prefix_cache_queries=v.get("prefix_cache_queries"),
        prefix_cache_hits=v.get("prefix_cache_hits"),
        spec_decode_draft_tokens=v.get("spec_decode_draft_tokens"),
        spec_decode_accepted_tokens=v.get("spec_decode_accepted_tokens"),
        ttft=raw.hists.get("ttft"),
        itl=raw.hists.get("itl"),
        e2e=raw.hists.get("e2e"),
        queue=raw.hists.get("queue"),
        prefill=raw.hists.get("prefill"),
        decode=raw.hists.get("decode"),
        disagg_queue_requests=_opt(raw.maps.get("disagg_queue_requests")),
        kv_transfer_failures=v.get("kv_transfer_failures"),
        kv_transfer_bytes=v.get("kv_transfer_bytes"),
        kv_transfer=raw.hists.get("kv_transfer"),
        cache_config=dict(raw.cache_config) if raw.cache_config else None,
        prompt_tokens_per_second=d.prompt_tokens_per_second,
        generation_tokens_per_second=d.generation_tokens_per_second,
        request_rate_per_second=d.request_rate_per_second,
        preemptions_per_second=d.preemptions_per_second,
        prefix_cache_hit_ratio=d.prefix_cache_hit_ratio,
        spec_decode_acceptance_ratio=d.spec_decode_acceptance_ratio,
        kv_transfer_latency_seconds=d.kv_transfer_latency_seconds,
        kv_transfer_speed_bytes_per_second=d.kv_transfer_speed_bytes_per_second,
        latency_quantiles=d.latency_quantiles,
    )


def _opt(m: object) -> dict[str, float] | None:
    return dict(m) if isinstance(m, dict) and m else None


OWN_PID = os.getpid()
