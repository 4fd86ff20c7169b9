"""Runs the collectors in the background and publishes one snapshot per cycle.

Collectors share one thread, each on a grid of its own interval: one thread waking
once a cycle costs a fraction of a dozen (a wake-up is ~0.1 ms of CPU on a small VM,
and on a real driver every NVML call would hand the GIL between the waiting threads).
A run that outlasts a cycle (a hung NVML call) is moved off it: the collector keeps the
thread it hangs in, the others and publishing go on in a new one, so a hung call still
stalls only its collector. One that waits on the network (`Collector.own_thread`) has
its own from the start. Every `interval` seconds, right after that point's collectors
and on their thread, the runner composes a snapshot from the latest output of every
collector, lets the enrichers add what is derived from the whole picture (engine-GPU
join, diagnosis), and publishes it; /metrics serves it until the next cycle, its bytes
made once per snapshot and format: by the first scrape that asks, or ahead of it when
scrapes come on a steady cadence (exporter/web/cadence.py).
"""

from __future__ import annotations

import dataclasses
import logging
import platform
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from exporter import __version__
from exporter.collectors.base import Collector, Output
from exporter.gpu_readings import DeviceFacts, MetricSource, MetricSources, Xid
from exporter.metricdef import has_value, metric_defs
from exporter.snapshot import CallErrors, CollectorStatus, ExporterInfo, GpuState, Snapshot
from exporter.web.cadence import Cadence
from exporter.web.exposition import DEFAULT, Exposure, Rendered, render

log = logging.getLogger(__name__)

KEPT_WHEN_DOWN = (DeviceFacts, Xid)
KEPT_FAMILIES = {cls.family for cls in KEPT_WHEN_DOWN}
DUE_SLACK_S = 0.005  # a wait may end a little before the grid point it was for
MIN_PERIOD_S = 0.05  # the shortest wall-clock grid a simulation played fast runs on
COUNTERS_KEPT_S = 300.0  # Prometheus' lookback: a stalled collector's counters end after it
# Publishing that has failed this long (or this many cycles, whichever is longer) makes
# the process unhealthy: a restart is the cure a liveness probe can give.
FAILING_S, FAILING_CYCLES = 30.0, 10
Enricher = Callable[[Snapshot], tuple[object, ...]]
Attribution = Callable[[int, str], Mapping[str, str]]  # GPU (index, uuid) -> namespace/pod/container/claim


@dataclass
class ServeStats:
    """Counters the HTTP side bumps and the next cycle exposes."""

    scrapes: int = 0
    auth_failures: Counter[str] = field(default_factory=Counter)


@dataclass(eq=False)  # a slot is itself: lanes find theirs by identity
class _Slot:
    collector: Collector
    output: Output | None = None
    completed_at: float | None = None  # monotonic
    duration: float = 0.0
    runs: int = 0
    success: bool = False
    errors: Counter[str] = field(default_factory=Counter)
    call_errors: Counter[tuple[str, str]] = field(default_factory=Counter)  # (function, error)
    logged: set[str] = field(default_factory=set)
    due_at: float = 0.0  # monotonic: its next grid point


@dataclass
class _Lane:
    """Collectors that take turns on one thread."""

    slots: list[_Slot]
    publishes: bool = False  # the one lane that publishes each cycle, after its collectors
    publish_at: float = 0.0  # monotonic: the next point of the publish grid
    running: _Slot | None = None
    since: float = 0.0  # monotonic: when the running one began
    thread: threading.Thread | None = None


def _counters_of(output: Output) -> Output:
    """The per-GPU counters of an output; gauges, GPU errors and node readings dropped."""
    gpus: dict[int, tuple[object, ...]] = {}
    for index, readings in output.gpus.items():
        kept = tuple(r for r in (_counters_only(r) for r in readings) if r is not None)
        if kept:
            gpus[index] = kept
    return Output(gpus=gpus)


def _counters_only(reading: object) -> object | None:
    """The reading with every non-counter metric set to None; None when nothing is left."""
    if not dataclasses.is_dataclass(reading) or isinstance(reading, type):
        return None
    changes: dict[str, object] = {}
    for f in dataclasses.fields(reading):
        value = getattr(reading, f.name)
        if f.metadata.get("nested"):
            changes[f.name] = tuple(s for s in (_counters_only(v) for v in value) if s is not None)
        elif "metric" in f.metadata and f.metadata["metric"].kind != "counter":
            changes[f.name] = None
    kept = dataclasses.replace(reading, **changes)
    return kept if has_value(kept) else None


class Runner:
    def __init__(
        self,
        collectors: Sequence[Collector],
        *,
        interval: float,
        gpu_count: int,
        enrichers: Sequence[Enricher] = (),
        clock: Callable[[], float] = time.time,
        pace: float = 1.0,
        simulated: bool = False,
        attribution: Attribution | None = None,
        exposure: Exposure = DEFAULT,
    ) -> None:
        self.interval = interval
        self.exposure = exposure
        # which source gave each merged metric: worked out only where it is written
        self._sources_shown = any(exposure.allows(m) for m in metric_defs(MetricSource))
        self.gpu_count = gpu_count
        self.enrichers = list(enrichers)
        self.clock = clock
        # Wall seconds per second of `clock` (1/speed in a played simulation): the grids are
        # seconds of `clock`, so a scenario played fast is sampled as a node in real time is.
        self.pace = pace
        self.simulated = simulated
        self.attribution = attribution
        self.stats = ServeStats()
        self.cadence = Cadence()  # when scrapes come, learnt from the server's requests
        self._slots = [_Slot(c) for c in collectors]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lanes: list[_Lane] = []
        self._publishing = threading.Lock()
        self._cycle_seconds = 0.0
        self._facts: dict[int, DeviceFacts] = {}  # last known, for GPUs that stopped answering
        self._ended: dict[threading.Thread, str] = {}  # a thread that raised, and what
        self._failing: tuple[float, str] | None = None  # publishing: since when, and why
        self.published: Rendered | None = None

    # ---- running -----------------------------------------------------------------------

    def start(self) -> None:
        for slot in self._slots:
            slot.collector.start()
        self._add_lane([s for s in self._slots if not s.collector.own_thread], publishes=True)
        for slot in self._slots:
            if slot.collector.own_thread:
                self._add_lane([slot])
        self._spawn("watchdog", self._watch)

    def _spawn(self, name: str, target: Callable[..., None], *args: object) -> threading.Thread:
        def run() -> None:
            try:
                target(*args)
            except BaseException as err:  # the thread ends here; health() says so
                self._ended[threading.current_thread()] = f"{type(err).__name__}: {err}"
                log.critical("thread %s ended", threading.current_thread().name, exc_info=True)

        t = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(t)
        t.start()
        return t

    def health(self) -> list[str]:
        """Why this process should be restarted, one reason a line; empty while it is
        sound. A thread of the runner that ended (a collector's, the publishing one, the
        watchdog) never comes back, and publishing that fails every cycle serves nothing:
        both would leave /metrics stale for good behind a process that still answers."""
        if self._stop.is_set():
            return []
        with self._lock:
            lanes = {lane.thread: lane for lane in self._lanes}
        out = []
        for t in list(self._threads):
            if t.is_alive():
                continue
            lane = lanes.get(t)
            ran = [] if lane is None else [s.collector.name for s in lane.slots]
            if lane is not None and lane.publishes:
                ran.append("publishing")
            what = f" ({', '.join(ran)})" if ran else ""
            out.append(f"thread {t.name}{what} ended: {self._ended.get(t, 'returned')}")
        failing = self._failing
        if failing is not None and time.monotonic() - failing[0] > max(
            FAILING_S, FAILING_CYCLES * self.interval
        ):
            out.append(f"publishing has failed for {time.monotonic() - failing[0]:.0f} s: {failing[1]}")
        return out

    def _add_lane(self, slots: Sequence[_Slot], publishes: bool = False) -> None:
        lane = _Lane(list(slots), publishes=publishes)
        with self._lock:
            self._lanes.append(lane)
        name = f"collector-{slots[0].collector.name}" if len(slots) == 1 and not publishes else "collectors"
        lane.thread = self._spawn(name, self._lane_loop, lane)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop and wait: collector loops first (no NVML call is in flight after them,
        unless one is hung past `timeout`), then each collector's own threads (the XID
        wait), so that NVML can be shut down behind this."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        # The watchdog first: it is the one that adds lanes, so none is added behind this.
        for threads in ([t for t in self._threads if t.name == "watchdog"], list(self._threads)):
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
                if t.is_alive():
                    log.warning("thread %s did not end within %.0f s (a hung NVML call)", t.name, timeout)
        for slot in self._slots:
            try:
                slot.collector.stop()
            except Exception:
                log.exception("stopping collector %s failed", slot.collector.name)

    # Each collector runs on a grid of its interval, and the lane that publishes does so
    # right after the collectors of each point of the publish grid: one wake-up a cycle,
    # the interpreter's caches warm from one collector to the next and into the snapshot,
    # which holds readings taken just before it.
    def _lane_loop(self, lane: _Lane) -> None:
        while not self._stop.is_set():
            with self._lock:
                slots = list(lane.slots)
            now = time.monotonic()
            for slot in slots:
                if slot.due_at > now + DUE_SLACK_S:
                    continue
                with self._lock:
                    if slot not in lane.slots:  # moved off this lane while an earlier one hung
                        continue
                    lane.running, lane.since = slot, time.monotonic()
                self.run_collector(slot)
                with self._lock:
                    lane.running = None
                slot.due_at = _next_point(self._period(slot.collector.interval_s))
            if lane.publishes and lane.publish_at <= now + DUE_SLACK_S:
                self._publish_cycle()
                lane.publish_at = _next_point(self._period(self.interval))
            with self._lock:
                wake = min([s.due_at for s in lane.slots] + ([lane.publish_at] if lane.publishes else []))
            self._stop.wait(max(0.0, wake - time.monotonic()))

    def _period(self, seconds: float) -> float:
        """A grid's period in wall seconds: `seconds` of the clock, never under MIN_PERIOD_S."""
        return seconds if self.pace == 1.0 else max(seconds * self.pace, MIN_PERIOD_S)

    def _publish_cycle(self) -> None:
        try:
            self.publish()
        except Exception as err:  # a bug in one cycle must not end publishing
            log.exception("publishing a snapshot failed")
            if self._failing is None:
                self._failing = (time.monotonic(), f"{type(err).__name__}: {err}")
        else:
            self._failing = None

    def _watch(self) -> None:
        # Every other cycle: a hung call costs at most three cycles of publishing.
        while not self._stop.wait(2 * self.interval):
            self._unstick()

    def _unstick(self) -> None:
        """Move everything off a lane whose current run has outlasted a cycle (the other
        collectors, and publishing) but the one hanging: that one keeps the thread, which
        serves only it from now on."""
        now = time.monotonic()
        moved: list[tuple[list[_Slot], bool]] = []
        with self._lock:
            for lane in self._lanes:
                hung = lane.running
                if hung is None or now - lane.since <= self.interval:
                    continue
                if len(lane.slots) == 1 and not lane.publishes:
                    continue  # alone already
                moved.append(([s for s in lane.slots if s is not hung], lane.publishes))
                lane.slots, lane.publishes = [hung], False
                if lane.thread is not None:
                    lane.thread.name = f"collector-{hung.collector.name}"
                log.warning(
                    "collector %s has been in one run for over %.1f s; it gets a thread of its own",
                    hung.collector.name,
                    self.interval,
                )
        for slots, publishes in moved:
            self._add_lane(slots, publishes)

    def run_collector(self, slot: _Slot) -> None:
        started = time.monotonic()
        try:
            output: Output | None = slot.collector.collect()
        except Exception as err:  # isolate: count it, keep the others running
            name = type(err).__name__
            if name not in slot.logged:
                slot.logged.add(name)
                log.exception("collector %s failed", slot.collector.name)
            output = None
            errors: Mapping[str, int] = {name: 1}
        else:
            assert output is not None
            errors = output.errors
        finished = time.monotonic()
        with self._lock:
            slot.runs += 1
            slot.duration = finished - started
            slot.success = not errors
            slot.errors.update(errors)
            if output is not None:
                slot.call_errors.update(output.call_errors)
                slot.output = output
                slot.completed_at = finished

    def step(self) -> Rendered:
        """Run every collector once, synchronously, then publish (stepped simulation, CLI)."""
        for slot in self._slots:
            slot.collector.refresh()
            self.run_collector(slot)
        return self.publish()

    # ---- composing -----------------------------------------------------------------------

    def publish(self) -> Rendered:
        with self._publishing:  # a lane handing publishing on may still be in its last one
            return self._publish()

    def _publish(self) -> Rendered:
        started = time.monotonic()
        snapshot = self.compose()
        for enrich in self.enrichers:
            try:
                added = enrich(snapshot)
            except Exception:
                log.exception("enricher %s failed", getattr(enrich, "__name__", enrich))
                continue
            snapshot = snapshot.with_node(added)
        rendered = render(snapshot, self.exposure)  # bytes are made when a scrape asks
        for body in self.cadence.due(started, self.interval):
            rendered.get(body)  # a steady scraper's next request meets this snapshot: make it now
        # Published once made: a request meanwhile is served the last snapshot's bytes
        # instead of waiting on this one's render.
        self.published = rendered
        self._cycle_seconds = time.monotonic() - started
        return rendered

    def compose(self) -> Snapshot:
        now_wall = time.monotonic()
        with self._lock:
            slots = [
                (s.collector, s.output, s.completed_at, s.duration, s.runs, s.success, dict(s.errors))
                for s in self._slots
            ]
            failed_calls = {s.collector.name: _call_errors(s.call_errors) for s in self._slots}
        fresh: list[tuple[Collector, Output]] = []
        statuses = []
        for collector, output, completed, duration, runs, success, errors in slots:
            age = None if completed is None else now_wall - completed
            statuses.append(
                CollectorStatus(
                    collector=collector.name,
                    success=int(success) if runs else None,
                    duration_seconds=duration if runs else None,
                    sample_age_seconds=age,
                    runs=runs,
                    errors=errors or None,
                    calls=failed_calls[collector.name],
                )
            )
            # A collector stuck in a hung call (on one GPU, say: its run covers them all)
            # stops vouching for its gauges after a while, and for its GPUs' state. Its
            # counters stay: a counter that vanishes and returns breaks rate() over the gap.
            if output is None or age is None:
                continue
            if age <= max(3 * collector.interval_s, 3 * self.interval, 5.0):
                fresh.append((collector, output))
            elif age <= COUNTERS_KEPT_S:
                fresh.append((collector, _counters_of(output)))
        # Lowest precedence first, so the higher one is placed last and wins (stable: name
        # order within one precedence).
        fresh.sort(key=lambda co: co[0].precedence)

        gpus = []
        for index in range(self.gpu_count):
            readings: dict[type, object] = {}
            origins: dict[type, dict[str, str]] = {}  # merged classes: field -> collector
            supported: dict[str, bool] = {}
            up = True
            known = self._uuid_of(index, fresh)
            for collector, out in fresh:
                if index in out.gpu_errors:
                    up = False
                placed = (*out.gpus.get(index, ()), *(out.by_uuid.get(known, ()) if known else ()))
                for r in placed:
                    _place(readings, origins, r, collector.name)
                    family = getattr(r, "family", None)
                    if family:
                        supported[family] = True
                for family in out.unsupported.get(index, ()):
                    supported.setdefault(family, False)
            if origins and self._sources_shown:
                readings[MetricSources] = _sources(origins)
                supported[MetricSources.family] = True
            facts = readings.get(DeviceFacts)
            if isinstance(facts, DeviceFacts):
                self._facts[index] = facts
            else:
                facts = self._facts.get(index)
            if not up:  # a GPU that stopped answering keeps its identity and its XIDs
                readings = {k: v for k, v in readings.items() if k in KEPT_WHEN_DOWN}
                if facts is not None:
                    readings[DeviceFacts] = facts
                supported = {f: s for f, s in supported.items() if f in KEPT_FAMILIES}
            uuid = facts.uuid if facts is not None else ""
            gpus.append(
                GpuState(
                    index=index,
                    uuid=uuid,
                    up=up,
                    readings=readings,
                    supported=supported,
                    attribution=self.attribution(index, uuid) if self.attribution and uuid else {},
                )
            )

        node: dict[type, tuple[object, ...]] = {}
        for _, out in fresh:
            for r in out.node:
                node[type(r)] = (*node.get(type(r), ()), r)
        node[ExporterInfo] = (
            ExporterInfo(
                build={"version": __version__, "python_version": platform.python_version()},
                simulated=int(self.simulated),
                cycle_seconds=self._cycle_seconds,
                scrapes=self.stats.scrapes,
                auth_failures=dict(self.stats.auth_failures) or None,
            ),
        )
        return Snapshot(
            taken_at=self.clock(),
            gpus=tuple(gpus),
            node=node,
            collectors=tuple(statuses),
            simulated=self.simulated,
        )

    def _uuid_of(self, index: int, fresh: Sequence[tuple[Collector, Output]]) -> str:
        """The GPU's UUID from this cycle's device facts, or the last ones known."""
        for _, out in fresh:
            for r in out.gpus.get(index, ()):
                if isinstance(r, DeviceFacts) and r.uuid:
                    return r.uuid
        facts = self._facts.get(index)
        return facts.uuid if facts is not None else ""


def _call_errors(counts: Mapping[tuple[str, str], int]) -> tuple[CallErrors, ...]:
    by_function: dict[str, dict[str, int]] = {}
    for (function, error), n in sorted(counts.items()):
        by_function.setdefault(function, {})[error] = n
    return tuple(CallErrors(function=f, errors=e) for f, e in by_function.items())


def _next_point(period: float) -> float:
    """The next point of the grid `k * period` (monotonic clock) more than DUE_SLACK_S
    away: a wait that ended a little early does not meet its own point again."""
    after = time.monotonic() + DUE_SLACK_S
    return after + period - after % period


def _place(readings: dict[type, object], origins: dict[type, dict[str, str]], r: object, source: str) -> None:
    """Put a reading on its GPU. A class that declares `merge_fields` keeps, field by field,
    what an earlier (lower-precedence) source gave where this one has nothing."""
    cls = type(r)
    if not getattr(cls, "merge_fields", False):
        readings[cls] = r
        return
    had = readings.get(cls)
    given = {f.name: source for f in dataclasses.fields(r) if getattr(r, f.name) is not None}  # type: ignore[arg-type]
    origin = origins.setdefault(cls, {})
    if had is not None:
        kept = {
            f.name: getattr(had, f.name)
            for f in dataclasses.fields(had)  # type: ignore[arg-type]
            if f.name not in given and getattr(had, f.name) is not None
        }
        r = dataclasses.replace(r, **kept)  # type: ignore[type-var]
    origin.update(given)
    readings[cls] = r


def _sources(origins: Mapping[type, Mapping[str, str]]) -> MetricSources:
    """Which collector gave each metric of the merged classes."""
    items = []
    for cls, fields in origins.items():
        metrics = {f.name: f.metadata.get("metric") for f in dataclasses.fields(cls)}
        for name, source in sorted(fields.items()):
            metric = metrics.get(name)
            if metric is not None:
                items.append(MetricSource(metric=metric.name, source=source, active=1))
    return MetricSources(items=tuple(items))
