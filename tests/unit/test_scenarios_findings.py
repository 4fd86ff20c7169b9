"""Every shipped scenario produces exactly the findings it declares, through the production path.

Each scenario is played on a manual clock: the fake NVML library under pynvml, every NVML
collector, the engine scraper reading the simulated vLLM servers over HTTP, the runner's
compose, the engine-GPU join and the Diagnoser, one full cycle every STEP_S scenario
seconds (plus one at the start of every fault, which a 1 s real-time interval would
catch). The check is strict both ways:

* the set of findings active at any time during the run equals `expect.findings`
  (nothing missing, nothing extra: healthy must produce none), and
* all of them are still active when the scenario ends, so `llm-gpu-exporter diagnose
  --simulate NAME` reports exactly the declared findings, and
* none flaps: each fires once on its subject and stays (a storm in waves included).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from exporter.config import Settings
from exporter.diagnosis.model import Diagnosis
from exporter.diagnosis.rules import RULES_BY_ID
from exporter.sim import node
from exporter.sim.probes import probed_engines
from exporter.sim.scenario import Scenario, builtin_names, load_builtin
from exporter.snapshot import Snapshot

pytestmark = pytest.mark.slow  # plays scenarios or starts servers: `make unit` leaves it out

STEP_S = 10.0
REQUIRED = (
    "healthy",
    "decode-memory-bound",
    "kv-pressure",
    "sm-saturation",
    "thermal-throttle",
    "nvlink-imbalance",
    "gpu-lost",
    "memory-leak",
    "mig",
    # every engine kind, and disaggregated serving, played end to end
    "sglang-retraction",
    "tgi-overloaded",
    "pd-prefill-bound",
    "pd-kv-transfer-slow",
)


@dataclass
class Played:
    ever: dict[str, float] = field(default_factory=dict)  # finding id -> scenario time it first fired
    fired: dict[tuple[str, str, str], set[float]] = field(default_factory=dict)  # -> times it fired
    end: set[str] = field(default_factory=set)
    last: Diagnosis | None = None
    engines_seen: int = 0


def sample_times(scenario: Scenario, step_s: float) -> list[float]:
    times = {round(i * step_s, 6) for i in range(int(scenario.duration // step_s) + 1)}
    times |= {f.at for f in scenario.faults if f.at <= scenario.duration}
    times.add(scenario.duration)
    return sorted(times)


def snapshots(name: str, step_s: float) -> Iterator[Snapshot]:
    """The scenario played to its end on a manual clock, one full cycle per sample time."""
    scenario = load_builtin(name)
    clock = node.ManualClock()
    # the allocator collector reads the simulator's own probe directory where the scenario
    # has probes; elsewhere it is off, so that no probe file of the host can join in
    off = () if probed_engines(scenario) else ("allocator",)
    exporter = node.build(Settings(simulate=name, collectors_disabled=off), clock)
    try:
        for t in sample_times(scenario, step_s):
            clock.t = t
            yield exporter.step()
    finally:
        exporter.close()


def play(name: str, step_s: float = STEP_S) -> Played:
    out = Played()
    start: float | None = None
    for snap in snapshots(name, step_s):
        d = snap.get(Diagnosis)
        assert d is not None, "the Diagnoser did not run as an enricher"
        start = snap.taken_at if start is None else start
        t = round(snap.taken_at - start, 3)
        for f in d.findings:
            out.ever.setdefault(f.id, t)
            out.fired.setdefault((f.id, *f.subject.key), set()).add(f.active_since)
        out.end = {f.id for f in d.findings}
        out.last = d
        out.engines_seen = max(out.engines_seen, len(d.engines))
    return out


def test_the_required_scenarios_ship() -> None:
    assert set(REQUIRED) <= set(builtin_names())


@pytest.mark.parametrize("name", builtin_names())
def test_scenario_declares_known_rules_and_fits_the_step(name: str) -> None:
    s = load_builtin(name)
    unknown = set(s.expect_findings) - set(RULES_BY_ID)
    assert not unknown, f"{name} expects unknown rules {unknown}"
    assert s.duration <= 20 * 60, "keep scenarios short: the test plays each to its end"
    assert s.description.strip() and s.engines, "a scenario tells an LLM-serving story"


@pytest.mark.parametrize("name", builtin_names())
def test_scenario_produces_exactly_its_declared_findings(name: str) -> None:
    scenario = load_builtin(name)
    played = play(name)
    expected = set(scenario.expect_findings)
    assert played.engines_seen == len(scenario.engines), "every simulated engine is scraped and diagnosed"
    missing = expected - set(played.ever)
    extra = set(played.ever) - expected
    assert not missing and not extra, (
        f"{name}: missing {sorted(missing)}, unexpected {sorted(extra)} (first fired at {played.ever})"
    )
    assert played.end == expected, f"{name}: active at the end {sorted(played.end)}"
    flapped = {k: len(v) for k, v in played.fired.items() if len(v) > 1}
    assert not flapped, f"{name}: fired more than once {flapped}"
