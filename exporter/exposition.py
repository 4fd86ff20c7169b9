"""Snapshot -> Prometheus text and OpenMetrics, rendered once per cycle and served as bytes.

Both formats and their gzip bodies are made here, once per cycle, so a scrape only picks
cached bytes. The writer is direct (one pass over the samples, label sets formatted once
each) because going through prometheus_client's generic generator cost ten times more.
"""

from __future__ import annotations

import gzip
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from exporter.metricdef import Histogram, Labels, MetricDef, samples
from exporter.snapshot import GpuUp, Snapshot

TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
GZIP_LEVEL = 1  # the body is re-made every cycle: speed over the last few percent of size


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


def families(snapshot: Snapshot) -> list[Family]:
    """Samples grouped into one family per metric name, sorted by name."""
    by_name: dict[str, Family] = {}
    for reading, base in readings_of(snapshot):
        for metric, labels, value in samples(reading, base):
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


@dataclass
class Rendered:
    """One cycle's exposition in both formats, plain and gzip."""

    snapshot: Snapshot
    text: bytes
    text_gzip: bytes
    openmetrics: bytes
    openmetrics_gzip: bytes
    rendered_at: float = field(default_factory=time.monotonic)


def render(snapshot: Snapshot) -> Rendered:
    text, om = _write(families(snapshot))
    return Rendered(
        snapshot,
        text,
        gzip.compress(text, compresslevel=GZIP_LEVEL),
        om,
        gzip.compress(om, compresslevel=GZIP_LEVEL),
    )
