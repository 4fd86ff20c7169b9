"""Every metric family the package declares, found by walking its reading classes.

docs/metrics.md is written from it (exporter.docgen); a test checks that a full scrape
exposes nothing it does not list.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Iterable, Iterator
from typing import Any

import exporter
from exporter.gpu_readings import GPU_READINGS
from exporter.metricdef import OWNER_LABELS, MetricDef
from exporter.snapshot import CollectorStatus, ExporterInfo, GpuUp

GPU_LABELS = ("gpu", "uuid")
SKIP_PACKAGES = ("exporter.probe.plugin",)  # runs inside engines; declares no metric


class DuplicateMetric(ValueError):
    """Two reading fields declare the same metric name; the message names both."""


def _modules() -> Iterator[Any]:
    for info in pkgutil.walk_packages(exporter.__path__, "exporter."):
        if info.name in SKIP_PACKAGES or info.name.endswith("__main__"):
            continue
        yield importlib.import_module(info.name)


def _reading_classes() -> list[type]:
    """Every dataclass of the package that declares a metric or nests readings that do."""
    found: dict[str, type] = {}
    for module in _modules():
        for obj in vars(module).values():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and _is_reading(obj):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


def _is_reading(cls: type) -> bool:
    return any("metric" in f.metadata or f.metadata.get("nested") for f in dataclasses.fields(cls))


def _nested_in(classes: Iterable[type]) -> set[type]:
    return {f.metadata["of"] for cls in classes for f in dataclasses.fields(cls) if f.metadata.get("nested")}


Row = tuple[MetricDef, tuple[str, ...], str]


def _rows(cls: type[Any], base: tuple[str, ...], family: str) -> Iterator[tuple[Row, type]]:
    fields = dataclasses.fields(cls)
    labels = base + tuple(f.name for f in fields if f.metadata.get("label"))
    if any(f.metadata.get("labels") for f in fields):
        labels += OWNER_LABELS
    for f in fields:
        metric = f.metadata.get("metric")
        if metric is not None:
            extra = (metric.label,) if metric.label else ()
            yield (metric, labels + extra, family), cls
        elif f.metadata.get("nested"):
            yield from _rows(f.metadata["of"], labels, family)


def rows(extra: Iterable[type] = ()) -> list[Row]:
    """(metric, labels, family) for everything the exporter can expose, sorted by name.

    Readings are walked from their roots (those no other reading nests), GPU readings
    with the `gpu` and `uuid` labels. A name declared by two fields raises
    DuplicateMetric: two quantities must never be merged into one family. `extra` adds
    reading classes to the walk (tests).
    """
    gpu_roots = (*GPU_READINGS, GpuUp)
    classes = [*_reading_classes(), *extra]
    assert CollectorStatus in classes and ExporterInfo in classes
    nested = _nested_in(classes)
    walk: list[tuple[type, tuple[str, ...], str]] = [
        (cls, GPU_LABELS, getattr(cls, "family", "")) for cls in gpu_roots
    ]
    walk += [(cls, (), "") for cls in classes if cls not in nested and cls not in gpu_roots]
    seen: dict[str, tuple[Row, type]] = {}
    for cls, base, family in walk:
        for row, owner in _rows(cls, base, family):
            name = row[0].name
            if name in seen and seen[name][0][0] is not row[0]:
                other = seen[name][1]
                raise DuplicateMetric(
                    f"{name} is declared by both {other.__module__}.{other.__qualname__} and "
                    f"{owner.__module__}.{owner.__qualname__}"
                )
            seen.setdefault(name, (row, owner))
    return [seen[k][0] for k in sorted(seen)]


def names() -> set[str]:
    return {m.name for m, _, _ in rows()}
