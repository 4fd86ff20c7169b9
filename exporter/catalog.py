"""The metric catalog (docs/metrics.md), generated from the reading declarations.

    python -m exporter.catalog > docs/metrics.md

A test regenerates it and fails when the committed file differs, and checks that a
full scrape exposes nothing the catalog does not list.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import re
from collections.abc import Iterable, Iterator
from typing import Any

import exporter
from exporter.gpu_readings import GPU_READINGS
from exporter.metricdef import MetricDef
from exporter.snapshot import CollectorStatus, ExporterInfo, GpuUp

GPU_LABELS = ("gpu", "uuid")
# Which GPUs provide each family; everything else works on every NVIDIA data-center GPU.
SUPPORT = {
    "gpm": "Hopper and later through NVML GPM; Volta and later data-center parts (A100, A10, L4, "
    "L40S) through a co-located dcgm-exporter; absent elsewhere",
    "sources": "where the profiling family is present",
    "nvlink": "GPUs with NVLink (SXM A100/H100/H200, B200)",
    "mig": "A100, A30, H100, H200, B200 (MIG-capable)",
    "ecc": "GPUs with ECC memory",
}
# Metrics whose support is narrower than their family's.
METRIC_SUPPORT = {
    "llmgpu_gpu_memory_temperature_celsius": "HBM parts only (A100, H100, H200, B200)",
    "llmgpu_gpu_clock_event_seconds_total": "all, from driver 535 on",
    "llmgpu_gpu_remapped_rows": "ECC parts from A100 on (row remapping)",
    "llmgpu_gpu_row_remap_pending": "ECC parts from A100 on (row remapping)",
    "llmgpu_gpu_row_remap_failed": "ECC parts from A100 on (row remapping)",
}
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


def _unit(name: str) -> str:
    for suffix in ("bytes_per_second", "bytes", "seconds", "watts", "joules", "hertz", "celsius", "ratio"):
        if re.search(rf"_{suffix}(_total)?$", name):
            return suffix.replace("_per_", "/")
    return "info" if name.endswith("_info") else "count"


def _source(help_text: str) -> str:
    match = re.search(r"\(([^()]*)\)\s*$", help_text)
    return match.group(1) if match else "exporter"


def markdown() -> str:
    lines = [
        "# Metric catalog",
        "",
        "Every series the exporter can expose, generated from the declarations in the code",
        "(`python -m exporter.catalog > docs/metrics.md`; a test keeps it current).",
        "A metric a GPU or engine cannot provide is absent, never zero;",
        "`llmgpu_gpu_metric_supported{family}` says which families each GPU provides.",
        "GPU series also carry `namespace`, `pod` and `container` when pod attribution is on.",
        "",
        "Profile: `default` families are exposed unless switched off (`metric_profile: default`,",
        "the setting's default); `full` families only with `metric_profile: full` or when named",
        "in `metrics_enabled` (`--metric NAME`). `metrics_disabled` (`--no-metric NAME`) leaves",
        "any family out. The diagnosis reads every reading whatever the profile.",
        "",
        "| name | type | labels | unit | source | GPUs | profile |",
        "|---|---|---|---|---|---|---|",
    ]
    for metric, labels, family in rows():
        help_text = metric.help.replace("|", "/")
        description = re.sub(r"\s*\([^()]*\)\s*$", "", help_text)
        support = ""
        if metric.name.startswith("llmgpu_gpu_"):
            support = METRIC_SUPPORT.get(metric.name) or SUPPORT.get(family, "all")
        label_list = ", ".join(f"`{x}`" for x in labels)
        lines.append(
            f"| `{metric.name}` | {metric.kind} | {label_list} | {_unit(metric.name)} "
            f"| {_source(help_text)} — {description} | {support} | {metric.profile} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
