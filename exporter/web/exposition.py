"""Snapshot -> Prometheus text and OpenMetrics, made when a scrape asks, once per snapshot.

Sampling runs every cycle for the diagnosis; exposition bytes cost more than sampling,
so they are made only for a snapshot that is scraped: on the first request for a format,
under a lock of that snapshot so that concurrent scrapes render once, and kept for every
later request of the same snapshot. The `Exposure` (metric profile and per-family
switches) decides which families are written. The writer is direct (going through
prometheus_client's generic generator cost ten times more) and incremental: each
exposure's `Writer` keeps the lines it wrote for every reading, and a reading equal to
the one in its place the cycle before costs a comparison, not a render.
"""

from __future__ import annotations

import gzip
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from exporter.metricdef import Histogram, Labels, MetricDef, Planner, Profile, in_profile, kept, with_labels
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
    writer: Writer = field(init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:  # frozen: set once
        object.__setattr__(self, "plan", kept(self.allows))
        object.__setattr__(self, "writer", Writer(self.plan))

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
                verdict = in_profile(metric.profile, self.profile)
            self._verdicts[metric.name] = verdict
        return verdict


def _value(v: object) -> str:
    """Go-style float formatting, as Prometheus writes it."""
    text = repr(float(v))  # type: ignore[arg-type]
    return _SPECIAL[text] if text[-1] in "nf" else text  # nan, inf, -inf


_SPECIAL = {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _help(text: str) -> str:
    """HELP text in the Prometheus text format, which escapes only backslash and newline."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _help_om(text: str) -> str:
    """HELP text in OpenMetrics, whose ABNF writes it as an escaped string: a double quote
    is escaped too, as client_python's OpenMetrics writer does."""
    return _help(text).replace('"', '\\"')


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

Chunks = tuple[tuple[MetricDef, str], ...]  # a reading's lines, a run of one family's each
Lines = list[tuple[MetricDef, str]]  # lines as written, with their family
# What a field of a reading class writes, its labels known: a plain sample (the line up
# to its value), one sample per mapping key, an info or histogram family, or nested readings.
PLAIN, MAPPING, INFO, HISTOGRAM, NESTED = range(5)
Step = tuple[str, int, MetricDef, Any]  # field, what it writes, its metric, prefix or prefixes
_NO_METRIC = MetricDef("", "gauge", "")  # a nested field's: its readings carry their own


class _Compiled:
    """Per reading class and label set, the steps that write its fields: label text and
    line prefixes are made once, a sample costs a getattr and its value's text."""

    def __init__(self, plan: Planner) -> None:
        self._plan = plan
        self._labels: dict[type, tuple[tuple[str, bool], ...]] = {}  # (field, holds label pairs)
        self._steps: dict[tuple[type, Labels], tuple[Step, ...]] = {}

    def chunks(self, reading: object, base: Labels) -> Chunks:
        """The reading's lines; a mapping's, and nested readings' consecutive lines of one
        family, joined (the findings of every rule, the XID counts by code: one run each)."""
        lines: Lines = []
        self._write(reading, base, lines)
        return tuple(lines)

    def _write(self, reading: object, labels: Labels, lines: Lines) -> None:
        cls = type(reading)
        own = self._labels.get(cls)
        if own is None:
            own = self._labels[cls] = tuple(
                (attr, role == "labels") for attr, role, _ in self._plan(cls) if role in ("label", "labels")
            )
        for attr, pairs in own:
            v = getattr(reading, attr)
            if pairs:
                labels = with_labels(labels, v)
            elif v is not None:
                labels = (*labels, (attr, str(v)))
        steps = self._steps.get((cls, labels))
        if steps is None:
            if len(self._steps) > LABEL_CACHE_MAX:
                self._steps.clear()
            steps = self._steps[(cls, labels)] = self._compile(cls, labels)
        for attr, op, metric, data in steps:
            value = getattr(reading, attr)
            if op == NESTED:
                inner: Lines = []
                for sub in value:
                    self._write(sub, labels, inner)
                lines.extend(_runs(inner))
            elif value is None:
                continue
            elif op == PLAIN:
                text = repr(float(value))
                lines.append((metric, f"{data}{_SPECIAL[text] if text[-1] in 'nf' else text}\n"))
            elif op == MAPPING:
                out = []
                for key, v in value.items():
                    if v is not None:
                        prefix = data.get(key)
                        if prefix is None:
                            prefix = data[key] = (
                                f"{metric.name}{_LABELS[(*labels, (str(metric.label), str(key)))]} "
                            )
                        out.append(f"{prefix}{_value(v)}\n")
                if out:
                    lines.append((metric, "".join(out)))
            else:
                lines.append((metric, "".join(_special(metric, labels, value))))

    def _compile(self, cls: type, labels: Labels) -> tuple[Step, ...]:
        steps: list[Step] = []
        for attr, role, metric in self._plan(cls):
            if role == "nested":
                steps.append((attr, NESTED, _NO_METRIC, None))
            elif role == "metric" and metric is not None:
                if metric.kind == "info":
                    steps.append((attr, INFO, metric, None))
                elif metric.kind == "histogram":
                    steps.append((attr, HISTOGRAM, metric, None))
                elif metric.label is not None:
                    steps.append((attr, MAPPING, metric, {}))
                else:
                    steps.append((attr, PLAIN, metric, f"{metric.name}{_LABELS[labels]} "))
        return tuple(steps)


def _runs(lines: Lines) -> Lines:
    """Consecutive lines of one family joined into one."""
    out: Lines = []
    run: list[str] = []
    for i, (metric, line) in enumerate(lines):
        run.append(line)
        if i + 1 == len(lines) or lines[i + 1][0] is not metric:
            out.append((metric, run[0] if len(run) == 1 else "".join(run)))
            run = []
    return out


def _special(metric: MetricDef, labels: Labels, value: Any) -> list[str]:
    """The lines of an info or a histogram sample."""
    name, label_text = metric.name, _LABELS
    if metric.kind == "info":
        return [f"{name}{label_text[labels + tuple((k, str(v)) for k, v in value.items())]} 1.0\n"]
    assert isinstance(value, Histogram)
    out = []
    for bound, count in value.buckets:
        le = "+Inf" if bound == math.inf else repr(float(bound))
        out.append(f"{name}_bucket{label_text[(*labels, ('le', le))]} {_value(count)}\n")
    out.append(f"{name}_count{label_text[labels]} {_value(value.count)}\n")
    out.append(f"{name}_sum{label_text[labels]} {_value(value.sum)}\n")
    return out


def _same(last: object, reading: object) -> bool:
    """Whether `reading` writes what `last` wrote: values are written as floats and labels
    as text, so equal fields write equal lines. (Comparing the instance dictionaries is
    the dataclass equality without its Python frame: a third of the cost.)"""
    if last is reading:
        return True
    if type(last) is not type(reading):
        return False
    return bool(getattr(last, "__dict__", last) == getattr(reading, "__dict__", reading))


class Family:
    """One family as written: its sample lines and its bytes in both formats. A family
    whose lines did not change from one cycle to the next is the same object."""

    __slots__ = ("metric", "om", "parts", "text")

    def __init__(self, metric: MetricDef, parts: list[str]) -> None:
        self.metric, self.parts = metric, parts  # each reading's lines
        body = "".join(parts)
        name, kind, help_line = metric.name, metric.kind, _help(metric.help)
        if kind in ("counter", "info"):  # OpenMetrics names the family without the suffix
            short = name.removesuffix("_total" if kind == "counter" else "_info")
            text_kind = "counter" if kind == "counter" else "gauge"
            self.text = f"# HELP {name} {help_line}\n# TYPE {name} {text_kind}\n{body}".encode()
            self.om = f"# HELP {short} {_help_om(metric.help)}\n# TYPE {short} {kind}\n{body}".encode()
        else:
            self.text = f"# HELP {name} {help_line}\n# TYPE {name} {kind}\n{body}".encode()
            self.om = (
                self.text
                if '"' not in metric.help
                else f"# HELP {name} {_help_om(metric.help)}\n# TYPE {name} {kind}\n{body}".encode()
            )


Slots = tuple[tuple[str, int], ...]  # where each of a reading's chunks sits: family, index in its parts
# A reading as written: its labels, lines and their places, and whether its lines changed
# the last time (a reading that moves every cycle, power or traffic, is written again
# without first being compared).
Entry = tuple[object, Labels, Chunks, Slots, bool]


class Writer:
    """Writes the snapshots of one exposure, keeping what it wrote last.

    Most readings are the same from one cycle to the next (device facts, ECC and XID
    counts, clocks, findings): a reading equal to the one in its place last time reuses
    that one's lines, and a family whose lines are all unchanged keeps its bytes, so a
    cycle costs what changed in it. Where the snapshot has the layout of the last one
    (the same readings in the same places, each writing the same families), the changed
    readings' lines replace theirs in their families' parts; otherwise every family is
    assembled again. The order is the snapshot's: each GPU's state and readings, then the
    node's readings, then the collectors' status. Two renders may run at once (a scrape
    of one snapshot, the publisher ahead of the next): each reads the last state and
    leaves its own, whole objects swapped, never edited.
    """

    def __init__(self, plan: Planner) -> None:
        self._compiled = _Compiled(plan)
        self._readings: list[Entry] = []
        self._families: dict[str, Family] = {}

    def families(self, snapshot: Snapshot) -> list[Family]:
        """The families of the snapshot, sorted by name."""
        if len(_LABELS) > LABEL_CACHE_MAX:
            _LABELS.clear()
        last, kept = self._readings, self._families
        placed = self._placed(snapshot, last)
        made: list[Entry] = []
        changed: list[Entry] = []
        same_layout = len(placed) == len(last)
        chunks = self._compiled.chunks
        for i, (reading, base) in enumerate(placed):
            entry = last[i] if i < len(last) else None
            if entry is not None and not entry[4] and entry[1] == base and _same(entry[0], reading):
                made.append(entry)
                continue
            new = chunks(reading, base)
            if entry is not None and new == entry[2]:  # written again, the same lines
                made.append((reading, base, entry[2], entry[3], False))
            elif same_layout and entry is not None and _layout(entry[2]) == _layout(new):
                made.append((reading, base, new, entry[3], True))
                changed.append(made[-1])
            else:
                same_layout = False
                made.append((reading, base, new, (), True))
        out = self._patched(kept, changed) if same_layout else self._assembled(made, kept)
        self._readings, self._families = made, out
        return list(out.values())

    @staticmethod
    def _placed(snapshot: Snapshot, last: list[Entry]) -> list[tuple[object, Labels]]:
        """Every reading with the labels its series carry, in the snapshot's order."""
        placed: list[tuple[object, Labels]] = []
        for gpu in snapshot.gpus:
            base = gpu.base_labels
            i = len(placed)
            up = last[i][0] if i < len(last) else None
            if not (isinstance(up, GpuUp) and up.up == int(gpu.up) and up.supported == gpu.supported):
                up = GpuUp(up=int(gpu.up), supported={f: int(s) for f, s in sorted(gpu.supported.items())})
            placed.append((up, base))
            placed.extend((reading, base) for reading in gpu.readings.values())
        for readings in snapshot.node.values():
            placed.extend((reading, ()) for reading in readings)
        placed.extend((status, ()) for status in snapshot.collectors)
        return placed

    @staticmethod
    def _patched(kept: dict[str, Family], changed: list[Entry]) -> dict[str, Family]:
        """The last families with the changed readings' lines in their places."""
        parts: dict[str, list[str]] = {}
        for _, _, new, slots, _ in changed:
            for (_, lines), (name, k) in zip(new, slots, strict=True):
                got = parts.get(name)
                if got is None:
                    got = parts[name] = list(kept[name].parts)
                got[k] = lines
        out = dict(kept)
        for name, p in parts.items():
            old = kept[name]
            if p != old.parts:
                out[name] = Family(old.metric, p)
        return out

    @staticmethod
    def _assembled(made: list[Entry], kept: dict[str, Family]) -> dict[str, Family]:
        """Every family put together from the readings' lines; `made` gets their slots."""
        by_name: dict[str, tuple[MetricDef, list[str]]] = {}
        for i, (reading, base, new, _, moved) in enumerate(made):
            slots = []
            for metric, lines in new:
                fam = by_name.get(metric.name)
                if fam is None:
                    fam = by_name[metric.name] = (metric, [])
                slots.append((metric.name, len(fam[1])))
                fam[1].append(lines)
            made[i] = (reading, base, new, tuple(slots), moved)
        out = {}
        for name in sorted(by_name):
            metric, parts = by_name[name]
            old = kept.get(name)
            # the same line strings as last time, in the same order: compared by identity first
            same = old is not None and old.metric is metric and old.parts == parts
            out[name] = old if same and old is not None else Family(metric, parts)
        return out


def _layout(chunks: Chunks) -> tuple[MetricDef, ...]:
    """The families a reading's chunks go to, in order."""
    return tuple(metric for metric, _ in chunks)


DEFAULT = Exposure()
EVERYTHING = Exposure("full")
EOF_LINE = b"# EOF\n"
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
        self._families: list[Family] | None = None

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
        if self._families is None:
            self._families = self.exposure.writer.families(self.snapshot)
            self.renders += 1
            self._bodies["text"] = b"".join(f.text for f in self._families)
            self._bodies["openmetrics"] = b"".join([*(f.om for f in self._families), EOF_LINE])
        if key.endswith("_gzip"):
            plain = self._bodies[key.removesuffix("_gzip")]
            self._bodies[key] = gzip.compress(plain, compresslevel=GZIP_LEVEL, mtime=0)
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
