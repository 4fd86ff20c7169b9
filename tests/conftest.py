"""Shared helpers: build the real exporter on the fake NVML library, on a manual clock."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter import app
from exporter.config import Settings
from exporter.sim import node


class Sim:
    """An exporter over a scenario whose clock the test moves."""

    def __init__(self, exporter: app.Exporter, clock: node.ManualClock) -> None:
        self.exporter = exporter
        self.clock = clock
        self.runner = exporter.runner

    def at(self, t: float):  # type: ignore[no-untyped-def]
        """Move scenario time to t and take one full sample; returns the snapshot."""
        self.clock.t = t
        return self.exporter.step()

    def text(self) -> str:
        assert self.runner.published is not None
        return self.runner.published.text.decode()


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[object]:
    made: list[Sim] = []

    def make(scenario: str, **settings: object) -> Sim:
        path = tmp_path / "scenario.yaml"
        path.write_text(textwrap.dedent(scenario))
        defaults: dict[str, object] = {"collectors_disabled": ("engines", "allocator")}
        s = Settings(scenario_file=str(path), **{**defaults, **settings})  # type: ignore[arg-type]
        clock = node.ManualClock()
        made.append(Sim(node.build(s, clock), clock))
        return made[-1]

    yield make
    for s in made:
        s.exporter.close()
