"""Metric declarations attached to reading fields, and the renderer that walks them.

A reading is a frozen dataclass whose fields carry their metric in the field metadata,
so a quantity is named, typed and documented exactly once. `None` means the GPU or
engine cannot provide it: the series is left out, never exported as zero.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["gauge", "counter", "info", "histogram", "summary"]
# Which exposition profile a family belongs to: `default` is what a fleet stores (every
# input of the diagnosis, the dashboards and the rules); `full` adds per-link and other
# detail. The profile filters exposition only; readings and the diagnosis see everything.
# `shared` adds what a fleet of shared GPUs (time-slicing, MPS, DRA shares) picks it for:
# each process' and each pod's part of a GPU.
Profile = Literal["default", "shared", "full"]
PROFILES: tuple[Profile, ...] = ("default", "shared", "full")


def in_profile(metric_profile: Profile, exposed: Profile) -> bool:
    """Whether a family of `metric_profile` is written under the `exposed` profile."""
    return metric_profile == "default" or exposed == "full" or metric_profile == exposed


@dataclass(frozen=True)
class MetricDef:
    """One exposed metric family. Counters are named with their `_total` suffix."""

    name: str
    kind: Kind
    help: str
    label: str | None = None  # extra label when the field holds a mapping key -> value
    profile: Profile = "default"  # the smallest profile that exposes it


def gauge(name: str, help: str, *, label: str | None = None, profile: Profile = "default") -> Any:
    return field(default=None, metadata={"metric": MetricDef(name, "gauge", help, label, profile)})


def counter(name: str, help: str, *, label: str | None = None, profile: Profile = "default") -> Any:
    assert name.endswith("_total"), name
    return field(default=None, metadata={"metric": MetricDef(name, "counter", help, label, profile)})


def info(name: str, help: str, *, profile: Profile = "default") -> Any:
    """A mapping of label -> value exposed as one `<name>` sample with value 1."""
    assert name.endswith("_info"), name
    return field(default=None, metadata={"metric": MetricDef(name, "info", help, None, profile)})


def histogram(name: str, help: str, *, profile: Profile = "default") -> Any:
    return field(default=None, metadata={"metric": MetricDef(name, "histogram", help, None, profile)})


def summary(name: str, help: str, *, label: str | None = None, profile: Profile = "default") -> Any:
    """Precomputed quantiles: labels include `quantile`, so the family must be a summary
    (promtool rejects that label on a gauge). No _sum or _count."""
    return field(default=None, metadata={"metric": MetricDef(name, "summary", help, label, profile)})


def label(default: Any = dataclasses.MISSING) -> Any:
    """A field that becomes a label on every sample of its reading."""
    return field(default=default, metadata={"label": True})


OWNER_LABELS = ("namespace", "pod", "container")  # what an `owner_labels()` field holds, before pod labels


def owner_labels() -> Any:
    """(name, value) label pairs added to every sample of the reading: its Kubernetes owner
    (OWNER_LABELS, then the pod labels the allow-list copies). They take the place of the
    same labels inherited from the GPU."""
    return field(default=(), metadata={"labels": True})


def nested(of: type) -> Any:
    """A tuple of sub-readings of class `of` (NVLink links, MIG instances, processes)."""
    return field(default=(), metadata={"nested": True, "of": of})


@dataclass(frozen=True)
class Histogram:
    """Cumulative buckets as Prometheus keeps them: (upper bound, count <= bound)."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float


Labels = tuple[tuple[str, str], ...]
Sample = tuple[MetricDef, Labels, Any]


Plan = tuple[tuple[str, str, MetricDef | None], ...]
_PLANS: dict[type, Plan] = {}


def _plan(cls: type[Any]) -> Plan:
    """Field walk order for a reading class: (attr, role, metric), computed once per class."""
    cached = _PLANS.get(cls)
    if cached is not None:
        return cached
    plan = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("label"):
            plan.append((f.name, "label", None))
        elif f.metadata.get("labels"):
            plan.append((f.name, "labels", None))
        elif f.metadata.get("nested"):
            plan.append((f.name, "nested", None))
        elif "metric" in f.metadata:
            plan.append((f.name, "metric", f.metadata["metric"]))
    # labels first, so nested and metric fields see them
    plan.sort(key=lambda p: p[1] not in ("label", "labels"))
    _PLANS[cls] = tuple(plan)
    return _PLANS[cls]


Planner = Callable[[type[Any]], Plan]


def kept(keep: Callable[[MetricDef], bool]) -> Planner:
    """Plans without the metrics `keep` refuses, nor nested readings left with none, so a
    walk never visits what exposition would drop (per-link readings in the default profile)."""
    plans: dict[type, Plan] = {}

    def plan(cls: type[Any]) -> Plan:
        found = plans.get(cls)
        if found is None:
            nested_of = {
                f.name: f.metadata["of"] for f in dataclasses.fields(cls) if f.metadata.get("nested")
            }
            found = plans[cls] = tuple(
                (attr, role, metric)
                for attr, role, metric in _plan(cls)
                if role in ("label", "labels")
                or (role == "metric" and metric is not None and keep(metric))
                or (role == "nested" and any(keep(m) for m in metric_defs(nested_of[attr])))
            )
        return found

    return plan


def samples(reading: object, base: Labels = (), plan: Planner = _plan) -> Iterator[Sample]:
    """Every (metric, labels, value) a reading holds, `None` values skipped."""
    labels = base
    for attr, role, metric in plan(type(reading)):
        value = getattr(reading, attr)
        if role == "label":
            if value is not None:
                labels = (*labels, (attr, str(value)))
        elif role == "labels":
            labels = with_labels(labels, value)
        elif role == "nested":
            for sub in value:
                yield from samples(sub, labels, plan)
        elif value is None:
            continue
        elif metric is not None and metric.label is not None:
            for key, v in value.items():
                if v is not None:
                    yield metric, (*labels, (metric.label, str(key))), v
        else:
            assert metric is not None
            yield metric, labels, value


def with_labels(labels: Labels, added: Labels) -> Labels:
    """`labels` with `added` in the place of any of the same names."""
    if not added:
        return labels
    names = {k for k, _ in added}
    return (*(lv for lv in labels if lv[0] not in names), *added)


def metric_defs(cls: type[Any]) -> Iterator[MetricDef]:
    """Every metric a reading class can expose, nested classes included."""
    hints = {f.name: f for f in dataclasses.fields(cls)}
    for attr, role, metric in _plan(cls):
        if metric is not None:
            yield metric
        elif role == "nested":
            yield from metric_defs(hints[attr].metadata["of"])


def has_value(reading: object) -> bool:
    """True when at least one metric field is provided (not None, not empty)."""
    for attr, role, _ in _plan(type(reading)):
        if role in ("label", "labels"):
            continue
        value = getattr(reading, attr)
        if value not in (None, (), {}):
            return True
    return False


def as_dict(readings: Iterable[object]) -> Mapping[str, Any]:
    """JSON-ready view of readings, keyed by class name."""
    return {type(r).__name__: dataclasses.asdict(r) for r in readings}  # type: ignore[call-overload]
