"""Scraping a dcgm-exporter and deciding which of its values are still worth using.

A scrape is the engine targets' bounded fetch and parse (exporter.engines.fetch): a cap
on the bytes, the series and the time, and one reason per failure. What comes back is
kept with the instant it was read. A value is used while it is fresh:

* the last good page is at most `max_age_s` old (a dcgm-exporter that stopped answering
  is not remembered forever);
* a GPU's samples, when the page timestamps them, are at most `max_age_s` old;
* a GPU's profiling values changed within `max_age_s`. dcgm-exporter prints no
  timestamps: when DCGM stops sampling (profiling paused, the host engine wedged) the
  page keeps serving its last values, and DCGM keeps samples up to 600 s
  (internal/pkg/devicewatcher/const.go maxKeepAge). Averages of a working GPU never
  repeat to the sixth decimal (%f) across several windows; values all zero (an idle
  GPU) may, and stay fresh.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx

from exporter.dcgm.location import DcgmTarget
from exporter.dcgm.scrape import DcgmPage, read_page
from exporter.dcgm.status import DCGM_SCRAPE_ERRORS, DcgmExporterTarget
from exporter.engines.fetch import Limits, ScrapeError, fetch, parse

log = logging.getLogger(__name__)


@dataclass
class _State:
    target: DcgmTarget
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DCGM_SCRAPE_ERRORS, 0))
    page: DcgmPage | None = None
    page_at: float | None = None  # clock() of the last good page
    values: dict[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    changed_at: dict[str, float] = field(default_factory=dict)
    duration: float | None = None
    up: bool = False
    last_error: str | None = None
    logged: str | None = None


@dataclass(frozen=True)
class Scrape:
    """One scrape's outcome: the fresh values by UUID, the self-metrics, the error."""

    values: Mapping[str, Mapping[str, float]]
    reading: DcgmExporterTarget
    error: ScrapeError | None


class DcgmSource:
    """Scrapes one dcgm-exporter at a time (the target may change: discovery)."""

    def __init__(self, limits: Limits, max_age_s: float, clock: Callable[[], float] = time.time) -> None:
        self.limits = limits
        self.max_age_s = max_age_s
        self.clock = clock
        self._states: dict[str, _State] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None

    def scrape(self, target: DcgmTarget) -> Scrape:
        state = self._states.get(target.url)
        if state is None or state.target != target:
            state = self._states[target.url] = _State(target)
        for url in [u for u in self._states if u != target.url]:
            del self._states[url]  # a target discovery replaced
        started = time.perf_counter()
        error: ScrapeError | None = None
        try:
            body = self._run(target.url)
            now = self.clock()  # the page's instant, before parsing
            limits = self.limits
            page = read_page(parse(body, limits.max_series, limits.max_labels, limits.max_label_length))
            del body
        except ScrapeError as err:
            error = err
        except Exception as err:  # never let one scrape break the collector
            error = ScrapeError("connection", f"{type(err).__name__}: {err}")
        state.duration = time.perf_counter() - started
        if error is None:
            self._observe(state, page, now)
        else:
            now = self.clock()
            state.errors[error.reason] = state.errors.get(error.reason, 0) + 1
        state.up = error is None
        state.last_error = str(error) if error else None
        _log_change(state, error)
        values, fresh, stale = self._current(state, now)
        page_now = state.page
        listed = page_now.listed if page_now else frozenset()
        reading = DcgmExporterTarget(
            target=target.url,
            source=target.source,
            up=int(state.up),
            scrape_duration_seconds=state.duration,
            scrape_errors=dict(state.errors),
            sample_age_seconds=None if state.page_at is None else max(0.0, now - state.page_at),
            gpus=None
            if page_now is None
            else {
                "fresh": len(fresh),
                "stale": len(stale),
                "no_profiling": len(listed - set(page_now.gpus)),
            },
            mig_samples=page_now.mig_samples if page_now else None,
            listed=listed,
            fresh=frozenset(fresh),
            stale=frozenset(stale),
            fields=page_now.fields if page_now else frozenset(),
            last_error=state.last_error,
        )
        return Scrape(values=values, reading=reading, error=error)

    def _observe(self, state: _State, page: DcgmPage, now: float) -> None:
        for uuid, gpu in page.gpus.items():
            key = tuple(sorted(gpu.values.items()))
            if state.values.get(uuid) != key:
                state.values[uuid] = key
                state.changed_at[uuid] = now
        for uuid in [u for u in state.values if u not in page.gpus]:
            del state.values[uuid], state.changed_at[uuid]
        state.page, state.page_at = page, now

    def _current(self, state: _State, now: float) -> tuple[dict[str, dict[str, float]], set[str], set[str]]:
        page, at = state.page, state.page_at
        if page is None or at is None:
            return {}, set(), set()
        if now - at > self.max_age_s:
            return {}, set(), set(page.gpus)
        values: dict[str, dict[str, float]] = {}
        stale: set[str] = set()
        for uuid, gpu in page.gpus.items():
            frozen = any(gpu.values.values()) and now - state.changed_at.get(uuid, now) > self.max_age_s
            old = gpu.oldest_timestamp is not None and now - gpu.oldest_timestamp > self.max_age_s
            if frozen or old:
                stale.add(uuid)
            else:
                values[uuid] = dict(gpu.values)
        return values, set(values), stale

    # ---- the fetch, on a loop of our own ------------------------------------------

    def _run(self, url: str) -> bytes:
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(self._fetch(url))

    async def _fetch(self, url: str) -> bytes:
        if self._client is None:
            # trust_env=False: a proxy meant for the outside must not catch a node-local scrape
            self._client = httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=None)
        return await fetch(self._client, url, self.limits)

    def close(self) -> None:
        loop, client = self._loop, self._client
        self._client = None
        if loop is not None and not loop.is_closed():
            if client is not None:
                loop.run_until_complete(client.aclose())
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
        self._loop = None


def _log_change(state: _State, error: ScrapeError | None) -> None:
    """One log line when the dcgm-exporter comes up, goes down or fails another way."""
    now = "up" if error is None else error.reason
    if now == state.logged:
        return
    first = state.logged is None
    state.logged = now
    url = state.target.url
    if error is None:
        log.info("dcgm-exporter %s is up", url)
    elif state.target.source == "local" and error.reason in ("refused", "dns"):
        log.debug("no dcgm-exporter at %s: %s", url, error)
    else:
        log.log(logging.INFO if first else logging.WARNING, "dcgm-exporter %s is down: %s", url, error)
