"""Frames rebuilt from the exposition equal the frames the live diagnosis builds.

Every shipped scenario is played on a manual clock through the production path; at each
cycle the exporter's own /metrics text is parsed into stored series (what a TSDB keeps of
a scrape) and `exporter.tsdb.frames` rebuilds the frame from them. It must equal
`frame_of(snapshot)` field by field, except what the exporter never exports: the engines'
process ids and the NUMA nodes of their CPUs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import Settings
from exporter.diagnosis.frame import EngineFrame, Frame, frame_of
from exporter.sim import node
from exporter.sim.scenario import builtin_names, load_builtin
from exporter.snapshot import Snapshot
from exporter.tsdb.families import FAMILIES
from exporter.tsdb.frames import NodeSeries, frames

WANTED = {f.name for f in FAMILIES}
# pids and CPU NUMA nodes are not exported; the engine's own scrape time is stood in for by
# the stored sample's
NOT_EXPORTED_ENGINE = ("pids", "cpu_numa_nodes", "scraped_at")
STEP_S = 60.0  # scenario seconds between cycles: every phase is seen


def played(name: str, step_s: float = STEP_S) -> Iterator[tuple[Snapshot, bytes]]:
    scenario = load_builtin(name)
    clock = node.ManualClock()
    exporter = node.build(Settings(simulate=name), clock)
    try:
        t = 0.0
        while t <= scenario.duration:
            clock.t = t
            rendered = exporter.runner.step()
            yield rendered.snapshot, rendered.text
            t += step_s
    finally:
        exporter.close()


def stored(node: NodeSeries, at: float, text: bytes) -> None:
    """What a TSDB keeps of one scrape: each sample under its name and labels, at `at`."""
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.name in WANTED:
                node.add(s.name, dict(s.labels), [(at, float(s.value))])


def merged(chunks: NodeSeries) -> NodeSeries:
    """Series of the same name and labels joined, as a range query returns them."""
    out = NodeSeries()
    for name, series in chunks.families.items():
        by: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
        for labels, points in series:
            by.setdefault(tuple(sorted(labels.items())), {}).update(points)
        for key, points in by.items():
            out.add(name, dict(key), points.items())
    return out


def comparable(frame: Frame) -> Frame:
    blank = {f: EngineFrame.__dataclass_fields__[f].default for f in NOT_EXPORTED_ENGINE}
    engines = tuple(dataclasses.replace(e, **blank) for e in sorted(frame.engines, key=lambda e: e.target))
    gpus = tuple(dataclasses.replace(g, process_pids=tuple(sorted(g.process_pids))) for g in frame.gpus)
    return Frame(frame.taken_at, gpus, engines, frame.simulated)


@pytest.mark.parametrize("name", builtin_names())
def test_rebuilt_frames_equal_live_frames(name: str) -> None:
    chunks = NodeSeries()
    live = []
    for snap, text in played(name):
        stored(chunks, snap.taken_at, text)
        live.append(comparable(frame_of(snap)))
    rebuilt = [comparable(f) for f in frames(merged(chunks))]
    assert [f.taken_at for f in rebuilt] == [f.taken_at for f in live]
    for want, got in zip(live, rebuilt, strict=True):
        for a, b in zip(want.gpus, got.gpus, strict=True):
            assert a == b, f"{name} at {want.taken_at}: GPU {a.index} differs"
        assert len(want.gpus) == len(got.gpus)
        assert want.engines == got.engines, f"{name} at {want.taken_at}: engines differ"
        assert want.simulated == got.simulated
