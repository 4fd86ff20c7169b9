"""Snapshot -> Prometheus text, rendered once per cycle and served as cached bytes."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.samples import Sample

from exporter.metricdef import Histogram, Labels, MetricDef, samples
from exporter.snapshot import GpuUp, Snapshot

TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


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


def families(snapshot: Snapshot) -> list[Metric]:
    """Group every sample into one family per metric name, in a stable order."""
    by_name: dict[str, Metric] = {}
    for reading, base in readings_of(snapshot):
        for metric, labels, value in samples(reading, base):
            fam = by_name.get(metric.name)
            if fam is None:
                fam = by_name[metric.name] = _family(metric)
            _add(fam, metric, labels, value)
    return [by_name[k] for k in sorted(by_name)]


def _family(m: MetricDef) -> Metric:
    if m.kind == "counter":
        return CounterMetricFamily(m.name.removesuffix("_total"), m.help)
    if m.kind == "info":
        return InfoMetricFamily(m.name.removesuffix("_info"), m.help)
    if m.kind == "histogram":
        return HistogramMetricFamily(m.name, m.help)
    if m.kind == "summary":
        return SummaryMetricFamily(m.name, m.help)
    return GaugeMetricFamily(m.name, m.help)


def _add(fam: Metric, m: MetricDef, labels: Labels, value: object) -> None:
    if m.kind == "info":
        assert isinstance(value, dict)
        info = {k: str(v) for k, v in value.items()}
        fam.samples.append(_sample(fam.name + "_info", {**dict(labels), **info}, 1.0))
    elif m.kind == "histogram":
        assert isinstance(value, Histogram)
        base = dict(labels)
        for bound, count in value.buckets:
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            fam.samples.append(_sample(fam.name + "_bucket", {**base, "le": le}, count))
        fam.samples.append(_sample(fam.name + "_count", base, value.count))
        fam.samples.append(_sample(fam.name + "_sum", base, value.sum))
    elif m.kind == "counter":
        fam.samples.append(_sample(fam.name + "_total", dict(labels), float(value)))  # type: ignore[arg-type]
    else:
        fam.samples.append(_sample(fam.name, dict(labels), float(value)))  # type: ignore[arg-type]


def _sample(name: str, labels: dict[str, str], value: float) -> Sample:
    return Sample(name, labels, value, None, None)


class _Families:
    """The minimal registry interface generate_latest needs."""

    def __init__(self, fams: Iterable[Metric]) -> None:
        self._fams = list(fams)

    def collect(self) -> Iterable[Metric]:
        return self._fams


@dataclass
class Rendered:
    """One cycle's exposition: plain text eagerly (with gzip), OpenMetrics on first ask."""

    snapshot: Snapshot
    text: bytes
    text_gzip: bytes
    _families: list[Metric]
    rendered_at: float = field(default_factory=time.monotonic)
    _openmetrics: bytes | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def openmetrics(self) -> bytes:
        with self._lock:
            if self._openmetrics is None:
                self._openmetrics = generate_openmetrics(_Families(self._families))  # type: ignore[no-untyped-call]
            return self._openmetrics


def render(snapshot: Snapshot) -> Rendered:
    fams = families(snapshot)
    text = generate_latest(_Families(fams))  # type: ignore[arg-type,unused-ignore]
    return Rendered(snapshot, text, gzip.compress(text, compresslevel=6), fams)
