"""Fetch a node's series for a span and run the Diagnoser over them in time order.

The span is fetched together with the history the rules read before it
(`history_seconds`, the Diagnoser's own window), with one range query per metric family
for every selected node at once, at the scrape step. Each step becomes a frame; the
frames go through an unchanged `Diagnoser`, so rules, hold and clear times and the OOM
score are the live ones.

Which families are fetched, and with which label matchers, is declared with the inputs
they feed (`exporter/diagnosis/inputs.py` SOURCES).

A simulation played `speed` times faster than real time writes its samples `speed`
times closer together than the scenario means them: `time_scale` stretches the frames'
times by that factor around the end of the span, so holds, rates and trends are
measured in scenario seconds as the live diagnosis measures them.
"""

from __future__ import annotations

import itertools
import math
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from exporter.diagnosis.diagnoser import Diagnoser
from exporter.diagnosis.inputs import SOURCES, Source
from exporter.diagnosis.model import Diagnosis
from exporter.diagnosis.thresholds import DEFAULT, Thresholds
from exporter.tsdb.client import QueryApi, TsdbError
from exporter.tsdb.frames import TIMELINE, NodeSeries, frames

MAX_POINTS = 10_000  # per series and query: Prometheus refuses more than 11,000
STEP_SAMPLE_S = 900.0  # raw samples read to find the scrape step
RESET_GAP_STEPS = 10  # a node silent this many steps (and 2 min) starts a fresh history
SILENT_S = 60.0  # a node whose last sample is older than this at the span's start was silent


class NoData(TsdbError):
    """No llmgpu_* series in the span (for the selection)."""


class UnknownNode(TsdbError):
    """The instance or node asked for has no series in the span."""

    def __init__(self, message: str, known: list[NodeKey]) -> None:
        super().__init__(message)
        self.known = known


@dataclass(frozen=True, order=True)
class NodeKey:
    instance: str
    node: str = ""  # the `node` target label, where relabelling sets one

    def __str__(self) -> str:
        return f"{self.node} ({self.instance})" if self.node and self.node != self.instance else self.instance


@dataclass(frozen=True)
class Selection:
    instance: str | None = None
    node: str | None = None
    matchers: str = ""  # extra PromQL label matchers, e.g. cluster="prod"

    def promql(self, with_node: bool = True) -> str:
        parts = [self.matchers] if self.matchers else []
        if with_node and self.instance is not None:
            parts.append(f'instance="{_escape(self.instance)}"')
        if with_node and self.node is not None:
            parts.append(f'node="{_escape(self.node)}"')
        return ", ".join(parts)

    @property
    def one_node(self) -> bool:
        return self.instance is not None or self.node is not None

    def picks(self, key: NodeKey) -> bool:
        return (self.instance is None or key.instance == self.instance) and (
            self.node is None or key.node == self.node
        )


@dataclass(frozen=True)
class Request:
    selection: Selection
    start: float  # first moment of the span (== end for a single moment)
    end: float
    step: float | None = None  # seconds; None: the scrape interval, read from the data
    time_scale: float = 1.0
    thresholds: Thresholds = DEFAULT
    history_seconds: float = 900.0

    @property
    def fetch_from(self) -> float:
        return self.start - self.history_seconds / self.time_scale

    def scaled(self, t: float) -> float:
        """A sample's time as the frame's time: stretched by the time scale around the end."""
        return self.end + (t - self.end) * self.time_scale

    def unscaled(self, t: float) -> float:
        return self.end + (t - self.end) / self.time_scale


@dataclass(frozen=True)
class Episode:
    """A finding active at some point of the span; times are the samples' (wall) times."""

    id: str
    severity: str
    gpu: str
    target: str
    subject: str
    first: float
    last: float
    at_end: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "gpu": self.gpu,
            "target": self.target,
            "subject": self.subject,
            "from": self.first,
            "to": self.last,
            "active_at_end": self.at_end,
        }


@dataclass
class NodeResult:
    key: NodeKey
    diagnosis: Diagnosis
    step: float  # seconds between the samples read
    frames: int
    first_sample: float
    last_sample: float
    episodes: list[Episode] = field(default_factory=list)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _window(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds))}s"


def known_nodes(api: QueryApi, req: Request) -> list[NodeKey]:
    """Every node with an exporter series in the fetched window (selection's extra matchers only)."""
    inner = req.selection.promql(with_node=False)
    expr = (
        f"count by (instance, node) (last_over_time({TIMELINE}{{{inner}}}"
        f"[{_window(req.end - req.fetch_from)}]))"
    )
    found = {
        NodeKey(s.labels.get("instance", ""), s.labels.get("node", "")) for s in api.query(expr, req.end)
    }
    return sorted(found)


def scrape_step(api: QueryApi, req: Request) -> float:
    """The median spacing of the raw samples near the end of the window."""
    span = req.end - req.fetch_from
    for seconds in (min(span, STEP_SAMPLE_S), span):
        expr = f"{TIMELINE}{{{req.selection.promql()}}}[{_window(seconds)}]"
        gaps: list[float] = []
        for s in api.query(expr, req.end):
            times = [t for t, _ in s.points]
            gaps.extend(b - a for a, b in itertools.pairwise(times) if b > a)
        if gaps:
            return round(float(statistics.median(gaps)), 3)
    raise NoData("too few samples in the span to read the scrape interval from; pass --step")


def fetch(api: QueryApi, req: Request, step: float, workers: int = 4) -> dict[str, NodeSeries]:
    """Every family for the selection, by instance; chunked to stay under the point limit."""
    matchers = req.selection.promql()
    start = math.floor(req.fetch_from / step) * step
    chunks = []
    t = start
    while t <= req.end:
        stop = min(req.end, t + step * (MAX_POINTS - 1))
        chunks.append((t, stop))
        t = stop + step
    jobs = [(src, a, b) for src in (Source(TIMELINE), *SOURCES) for a, b in chunks]

    def run(job: tuple[Source, float, float]) -> tuple[Source, list[Any]]:
        src, a, b = job
        return src, api.query_range(src.selector(matchers), a, b, step)

    nodes: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], dict[float, float]]] = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for src, result in pool.map(run, jobs):
            for s in result:
                labels = {k: v for k, v in s.labels.items() if k != "__name__"}
                key = (src.family, tuple(sorted(labels.items())))
                nodes.setdefault(labels.get("instance", ""), {}).setdefault(key, {}).update(s.points)
    out: dict[str, NodeSeries] = {}
    for instance, series in nodes.items():
        node = out[instance] = NodeSeries()
        for (name, pairs), points in series.items():
            node.add(name, dict(pairs), points.items())
    return out


def replay(key: NodeKey, series: NodeSeries, req: Request, step: float) -> NodeResult | None:
    """The node's diagnosis at the end of the span; None without a frame in the window."""
    times = series.times()
    if not times or times[-1] < req.start - max(SILENT_S, 2 * step):
        return None  # silent through the span: its last state is history, not the answer
    built = [f for f in frames(series, req.scaled) if f.taken_at <= req.scaled(req.end)]
    diagnoser = Diagnoser(history_seconds=req.history_seconds, thresholds=req.thresholds)
    gap = max(RESET_GAP_STEPS * step, 120.0) * req.time_scale
    span_from = req.scaled(req.start)
    open_: dict[tuple[str, str, str], Episode] = {}
    done: list[Episode] = []
    last: Diagnosis | None = None
    prev: float | None = None
    for frame in built:
        if prev is not None and frame.taken_at - prev > gap:
            diagnoser.reset()
        prev = frame.taken_at
        _, _, last = diagnoser.step(frame)
        if frame.taken_at >= span_from:
            _track(open_, done, last, req)
    assert last is not None
    episodes = sorted([*done, *open_.values()], key=lambda e: (e.first, e.id, e.gpu, e.target))
    return NodeResult(key, last, step, len(built), times[0], times[-1], episodes)


def _track(
    open_: dict[tuple[str, str, str], Episode], done: list[Episode], d: Diagnosis, req: Request
) -> None:
    now = {(f.id, f.subject.gpu, f.subject.target): f for f in d.findings}
    for k in [k for k in open_ if k not in now]:
        done.append(replace(open_.pop(k), at_end=False))
    at = req.unscaled(d.taken_at)
    for k, f in now.items():
        ep = open_.get(k)
        first = ep.first if ep else req.unscaled(f.active_since)
        open_[k] = Episode(f.id, f.severity, f.subject.gpu, f.subject.target, f.subject_name, first, at, True)


def diagnose(api: QueryApi, req: Request) -> tuple[list[NodeResult], list[NodeKey]]:
    """The selected node's (or every node's) result at the end of the span, and the nodes
    known in the history window that sent nothing during the span."""
    known = known_nodes(api, req)
    if not known:
        raise NoData("no llmgpu_exporter series between the start of the history and the end of the span")
    picked = [k for k in known if req.selection.picks(k)]
    if not picked:
        asked = req.selection.instance or req.selection.node
        raise UnknownNode(f"no node {asked!r} in the span", known)
    step = req.step or scrape_step(api, req)
    data = fetch(api, req, step)
    results, silent = [], []
    for key in picked:
        series = data.get(key.instance)
        result = replay(key, series, req, step) if series is not None else None
        if result is None:
            silent.append(key)
        else:
            results.append(result)
    if not results:
        who = ", ".join(str(k) for k in silent)
        raise NoData(f"no sample of {who} in the span: it was silent (or not scraped) then")
    return results, silent
