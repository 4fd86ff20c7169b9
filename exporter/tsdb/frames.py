"""Frames rebuilt from stored series: the series of one node, and a frame per scrape time.

Which metric family (and labels) each frame field comes from, and how its samples reduce
and normalise, is declared once in `exporter/diagnosis/inputs.py`; the live frame is made
from the same declarations. What the exporter never exports stays empty (`LIVE_ONLY`
there): the engines' process ids and the NUMA nodes of their CPUs, so
`hardware/numa_mismatch` cannot fire from a TSDB.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from exporter.diagnosis.frame import Frame, frame_at
from exporter.diagnosis.inputs import ENGINE_UP, GPU_UP, Row

TIMELINE = "llmgpu_exporter_build_info"  # one sample per scrape that answered: the node's timeline
Labels = tuple[tuple[str, str], ...]  # sorted by name, as the frame's rows carry them


@dataclass
class NodeSeries:
    """Every fetched series of one node, by family name, points keyed by time."""

    families: dict[str, list[tuple[Labels, dict[float, float]]]] = field(default_factory=dict)

    def add(self, family: str, labels: Mapping[str, str], points: Iterable[tuple[float, float]]) -> None:
        self.families.setdefault(family, []).append((tuple(sorted(labels.items())), dict(points)))

    def times(self) -> list[float]:
        """The node's scrape times: where its build-info series (or any GPU or engine) has a point."""
        stamps: set[float] = set()
        for name in (TIMELINE, GPU_UP, ENGINE_UP):
            for _, points in self.families.get(name, ()):
                stamps.update(points)
        return sorted(stamps)

    def at(self, t: float) -> dict[str, list[Row]]:
        return {
            name: [(labels, points[t]) for labels, points in series if t in points]
            for name, series in self.families.items()
        }


def frames(node: NodeSeries, taken_at: Callable[[float], float] = float) -> list[Frame]:
    """One frame per scrape time of the node, oldest first; `taken_at` maps a sample's
    time to the frame's (a time scale for simulations played fast)."""
    return [frame_at(node.at(t), taken_at(t)) for t in node.times()]
