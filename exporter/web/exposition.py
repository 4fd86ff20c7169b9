"""Snapshot -> Prometheus text and OpenMetrics, made when a scrape asks, once per snapshot.

Sampling runs every cycle for the diagnosis; exposition bytes cost more than sampling,
so they are made only for a snapshot that is scraped: on the first request for a format,
under a lock of that snapshot so that concurrent scrapes render once, and kept for every
later request of the same snapshot. The `Exposure` (metric profile and per-family
switches) decides which families are written. The writer is direct (one pass over the
samples, label sets formatted once each) because going through prometheus_client's
generic generator cost ten times more.
"""

from __future__ import annotations

import gzip
import math
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from exporter.metricdef import Histogram, Labels, MetricDef, Planner, Profile, kept, samples
from exporter.snapshot import GpuUp, Snapshot

TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
GZIP_LEVEL = 1  # made while a scrape waits: speed over the last few percent of size


@dataclass(frozen=True)
class Exposure:
    """Which metric families are written: a profile, then families switched on or off by name
    (a name in both lists is off)."""

    profile: Profile = "default"
    enabled: frozenset[str] = frozenset()
    disabled: frozenset[str] = frozenset()
    _verdicts: dict[str, bool] = field(default_factory=dict, compare=False, hash=False, repr=False)
    plan: Planner = field(init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "plan", kept(self.allows))  # frozen: set once

    @classmethod
    def of(cls, profile: Profile, enabled: Iterable[str] = (), disabled: Iterable[str] = ()) -> Exposure:
        return cls(profile, frozenset(enabled), frozenset(disabled))

    def allows(self, metric: MetricDef) -> bool:
        verdict = self._verdicts.get(metric.name)
        if verdict is None:
            if metric.name in self.disabled:
                verdict = False
            elif metric.name in self.enabled:
                verdict = True
            else:
                verdict = self.profile == "full" or metric.profile == "default"
            self._verdicts[metric.name] = verdict
        return verdict


DEFAULT = Exposure()
EVERYTHING = Exposure("full")


def readings_of(snapshot: Snapshot) -> Iterator[tuple[object, Labels]]:
    """Every reading in the snapshot with the labels its series carry."""
    for gpu in snapshot.gpus:
        base = gpu.base_labels
        yield GpuUp(up=int(gpu.up), supported={f: int(s) for f, s in sorted(gpu.supported.items())}), base
        for reading in gpu.readings.values():
            yield reading, base
    for readings in snapshot.node.values():
        for reading in readings:
            yield reading, ()
    for status in snapshot.collectors:
        yield status, ()


Family = tuple[MetricDef, list[tuple[Labels, object]]]


def families(snapshot: Snapshot, exposure: Exposure = DEFAULT) -> list[Family]:
    """Samples of the families `exposure` allows, one family per metric name, sorted by name."""
    by_name: dict[str, Family] = {}
    plan = exposure.plan
    for reading, base in readings_of(snapshot):
        for metric, labels, value in samples(reading, base, plan):
            fam = by_name.get(metric.name)
            if fam is None:
                fam = by_name[metric.name] = (metric, [])
            fam[1].append((labels, value))
    return [by_name[k] for k in sorted(by_name)]


def _value(v: object) -> str:
    """Go-style float formatting, as Prometheus writes it."""
    f = float(v)  # type: ignore[arg-type]
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    return repr(f)


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


class _LabelCache(dict[Labels, str]):
    """`{a="1",b="2"}` for a label set, sorted by name. Label sets barely change from one
    cycle to the next, so the cache lives across renders (emptied if it grows past a bound).
    """

    def __missing__(self, labels: Labels) -> str:
        text = "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels)) + "}" if labels else ""
        self[labels] = text
        return text


_LABELS = _LabelCache()
LABEL_CACHE_MAX = 200_000


def _write(fams: list[Family]) -> tuple[bytes, bytes]:
    """(text format, OpenMetrics): the sample lines are the same, the headers differ."""
    text: list[str] = []
    om: list[str] = []
    label_text = _LABELS
    if len(label_text) > LABEL_CACHE_MAX:
        label_text.clear()
    for metric, rows in fams:
        name, kind = metric.name, metric.kind
        help_line = _help(metric.help)
        if kind in ("counter", "info"):  # OpenMetrics names the family without the suffix
            short = name.removesuffix("_total" if kind == "counter" else "_info")
            text.append(
                f"# HELP {name} {help_line}\n# TYPE {name} {'counter' if kind == 'counter' else 'gauge'}\n"
            )
            om.append(f"# HELP {short} {help_line}\n# TYPE {short} {kind}\n")
        else:
            header = f"# HELP {name} {help_line}\n# TYPE {name} {kind}\n"
            text.append(header)
            om.append(header)
        lines: list[str] = []
        if kind == "info":
            for labels, value in rows:
                info_labels = labels + tuple((k, str(v)) for k, v in value.items())  # type: ignore[attr-defined]
                lines.append(f"{name}{label_text[info_labels]} 1.0\n")
        elif kind == "histogram":
            for labels, value in rows:
                assert isinstance(value, Histogram)
                for bound, count in value.buckets:
                    le = "+Inf" if bound == math.inf else repr(float(bound))
                    lines.append(f"{name}_bucket{label_text[(*labels, ('le', le))]} {_value(count)}\n")
                lines.append(f"{name}_count{label_text[labels]} {_value(value.count)}\n")
                lines.append(f"{name}_sum{label_text[labels]} {_value(value.sum)}\n")
        else:
            lines.extend(f"{name}{label_text[labels]} {_value(value)}\n" for labels, value in rows)
        body = "".join(lines)
        text.append(body)
        om.append(body)
    om.append("# EOF\n")
    return "".join(text).encode(), "".join(om).encode()


BODIES = ("text", "text_gzip", "openmetrics", "openmetrics_gzip")


class Rendered:
    """One snapshot's exposition in both formats, plain and gzip, each made on first use.

    The attributes read like plain bytes; the first read of a body renders it (text and
    OpenMetrics share one pass over the samples, gzip is per body) under this snapshot's
    lock, so concurrent scrapes wait for one render instead of making their own. That
    first read is a scrape's, or the publisher's ahead of a steady scraper's request.
    `rendered_at` is when the snapshot was published.
    """

    def __init__(self, snapshot: Snapshot, exposure: Exposure = DEFAULT) -> None:
        self.snapshot = snapshot
        self.exposure = exposure
        self.rendered_at = time.monotonic()
        self.renders = 0  # passes over the samples: at most one per snapshot
        self._lock = threading.RLock()  # a gzip body renders its plain body under it
        self._bodies: dict[str, bytes] = {}

    def get(self, key: str) -> bytes:
        """One of BODIES, made now unless it was made before."""
        body = self._bodies.get(key)
        if body is not None:
            return body
        with self._lock:
            body = self._bodies.get(key)
            if body is None:  # not made by the request that held the lock before us
                body = self._make(key)
            return body

    def _make(self, key: str) -> bytes:
        if key.endswith("_gzip"):
            plain = self.get(key.removesuffix("_gzip"))  # the lock is held: render inline
            self._bodies[key] = gzip.compress(plain, compresslevel=GZIP_LEVEL)
        else:
            text, om = _write(families(self.snapshot, self.exposure))
            self.renders += 1
            self._bodies["text"], self._bodies["openmetrics"] = text, om
        return self._bodies[key]

    def made(self) -> tuple[str, ...]:
        """The bodies made so far (tests, benchmarks)."""
        return tuple(sorted(self._bodies))

    @property
    def text(self) -> bytes:
        return self.get("text")

    @property
    def text_gzip(self) -> bytes:
        return self.get("text_gzip")

    @property
    def openmetrics(self) -> bytes:
        return self.get("openmetrics")

    @property
    def openmetrics_gzip(self) -> bytes:
        return self.get("openmetrics_gzip")


def render(snapshot: Snapshot, exposure: Exposure = DEFAULT) -> Rendered:
    """The snapshot ready to serve; nothing is rendered until a body is read."""
    return Rendered(snapshot, exposure)
