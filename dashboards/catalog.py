"""Which metric names exist: declared by the exporter, listed in docs/metrics.md, recorded by rules.

Dashboards and alerts may only read names the exporter declares (and, once the catalog
exists, that docs/metrics.md lists) or that a recording rule in alerts/ produces, and
only names of the default metric profile: what a fleet's Prometheus stores by default.
"""

from __future__ import annotations

import re
import sys
from functools import cache
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CATALOG = ROOT / "docs" / "metrics.md"
RULES = sorted((ROOT / "alerts").glob("*.rules.yml"))

_NAME = re.compile(r"\bllmgpu_[a-z0-9_]+\b")
# Series Prometheus adds itself.
PROMETHEUS = frozenset({"up"})


@cache
def declared() -> dict[str, str]:
    """Metric name -> kind for every metric the exporter package declares (exporter.catalog)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from exporter import catalog

    return {metric.name: metric.kind for metric, _, _ in catalog.rows()}


@cache
def full_only() -> frozenset[str]:
    """Names (as Prometheus has them) that only the full metric profile exposes."""
    from exporter import catalog

    kinds = {m.name: m.kind for m, _, _ in catalog.rows() if m.profile != "default"}
    return frozenset(exposed_names(kinds))


def exposed_names(kinds: dict[str, str]) -> set[str]:
    """Names as they appear in Prometheus: histograms as _bucket, _sum and _count too."""
    names = set(kinds)
    for name, kind in kinds.items():
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


@cache
def cataloged() -> frozenset[str] | None:
    """Names docs/metrics.md lists (None while it does not exist)."""
    if not CATALOG.exists():
        return None
    kinds = {name: declared().get(name, "") for name in _NAME.findall(CATALOG.read_text(encoding="utf-8"))}
    return frozenset(exposed_names(kinds))


@cache
def recorded() -> frozenset[str]:
    names: set[str] = set()
    for path in RULES:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            names |= {rule["record"] for rule in group["rules"] if "record" in rule}
    return frozenset(names)


def problems(names: set[str] | list[str]) -> list[str]:
    """Why each name is not allowed in a dashboard or rule; empty when all are fine."""
    exposed = exposed_names(declared())
    listed = cataloged()
    out = []
    for name in sorted(set(names)):
        if name in PROMETHEUS or name in recorded():
            continue
        if name not in exposed:
            out.append(f"{name}: not declared by the exporter")
        elif listed is not None and name not in listed:
            out.append(f"{name}: not listed in docs/metrics.md")
        elif name in full_only():
            out.append(f"{name}: exposed by the full metric profile only, not by default")
    return out
