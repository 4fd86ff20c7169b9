"""A100 and L4 GPUs read through a dcgm-exporter give the findings H100s give through GPM.

The scenario matrix (test_scenarios_findings.py) plays every shipped scenario, the DCGM
ones among them. Here each story of a GPM scenario is played again on a GPU without GPM
(the scenario's GPU model swapped, a simulated dcgm-exporter added) through the
production path: the fake NVML, the dcgm-exporter on loopback, the dcgm collector, the
runner's precedence and the Diagnoser. The findings must be exactly the H100's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import Settings
from exporter.diagnosis import coverage
from exporter.diagnosis.model import Diagnosis
from exporter.gpu_readings import MetricSources, Profiling
from exporter.sim import node
from exporter.sim.scenario import builtin_names, load_builtin, load_file
from exporter.snapshot import Snapshot
from exporter.web.page import render_page

pytestmark = pytest.mark.slow  # plays scenarios or starts servers: `make unit` leaves it out

STEP_S = 10.0
SCENARIOS = Path(__file__).resolve().parents[2] / "exporter" / "sim" / "scenarios"
# (GPM scenario, GPU model without GPM); L4 stories are single-GPU ones (no NVLink for TP)
PAIRS = (
    ("decode-memory-bound", "A100-80GB-SXM"),
    ("sm-saturation", "A100-80GB-SXM"),
    ("nvlink-imbalance", "A100-80GB-SXM"),
    ("healthy", "A100-80GB-SXM"),
    ("fp32-fallback", "L4"),
    ("small-batches", "L4"),
)
# shipped DCGM scenarios and the GPM story each retells
SHIPPED = {"decode-memory-bound-a100": "decode-memory-bound", "busy-idle-sms-l4": "small-batches"}
BLIND = "decode-memory-bound-a100-no-profiling"


@dataclass
class Played:
    ever: set[str] = field(default_factory=set)
    end: set[str] = field(default_factory=set)
    last: Snapshot | None = None
    text: str = ""


def play(path: Path) -> Played:
    scenario = load_file(path)
    clock = node.ManualClock()
    exporter = node.build(
        Settings(
            scenario_file=str(path),
            collectors_disabled=("allocator",),
            metrics_enabled=("llmgpu_gpu_metric_source",),  # which source gave each metric
        ),
        clock,
    )
    out = Played()
    times = sorted(
        {round(i * STEP_S, 6) for i in range(int(scenario.duration // STEP_S) + 1)} | {scenario.duration}
    )
    try:
        for t in times:
            clock.t = t
            snap = exporter.runner.step().snapshot
            d = snap.get(Diagnosis)
            assert d is not None
            out.ever |= {f.id for f in d.findings}
            out.end = {f.id for f in d.findings}
            out.last = snap
        assert exporter.runner.published is not None
        out.text = exporter.runner.published.text.decode()
    finally:
        exporter.close()
    return out


def variant(name: str, model: str, tmp: Path) -> Path:
    data = yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text())
    data["name"] = f"{name}-{model.lower()}-dcgm"
    data["gpus"]["model"] = model
    data["dcgm_exporter"] = {}
    path = tmp / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def sources(snap: Snapshot) -> Iterator[tuple[int, str, str]]:
    for g in snap.gpus:
        ms = g.get(MetricSources)
        for item in ms.items if ms else ():
            yield g.index, item.metric, item.source


@pytest.mark.parametrize(("name", "model"), PAIRS)
def test_the_story_read_through_dcgm_gives_the_gpm_findings(name: str, model: str, tmp_path: Path) -> None:
    expected = set(load_builtin(name).expect_findings)
    played = play(variant(name, model, tmp_path))
    assert played.ever == expected and played.end == expected, (name, model, played.ever, played.end)
    assert played.last is not None
    got = set(sources(played.last))
    assert got and {s for _, _, s in got} == {"dcgm"}, "every profiling metric came from the dcgm-exporter"
    assert all(g.get(Profiling) is not None for g in played.last.gpus)


def test_the_shipped_dcgm_scenarios_retell_a_gpm_story() -> None:
    for dcgm_name, gpm_name in SHIPPED.items():
        dcgm, gpm = load_builtin(dcgm_name), load_builtin(gpm_name)
        assert dcgm.dcgm_exporter is not None and not dcgm.gpu_model.gpm
        assert gpm.dcgm_exporter is None and gpm.gpu_model.gpm
        assert dcgm.expect_findings == gpm.expect_findings
    assert set(SHIPPED) | {BLIND} <= set(builtin_names())


def test_without_any_profiling_source_the_blind_spots_are_said_out_loud() -> None:
    played = play(SCENARIOS / f"{BLIND}.yaml")
    assert played.ever == set(), "no rule guesses DRAM bandwidth from NVML's memory-busy ratio"
    assert played.last is not None
    d = played.last.get(Diagnosis)
    assert d is not None
    spots = d.to_json()["blind_spots"]
    want = {(rule, str(g)) for rule in coverage.RULE_SIGNALS for g in range(4)}
    assert {(s["rule"], s["gpu"]) for s in spots} == want
    dram = next(s for s in spots if s["rule"] == "hardware/dram_bandwidth_bound")
    assert dram["signal"] == "dram_active"
    assert "no DRAM-bandwidth signal on NVIDIA A100-SXM4-80GB" in dram["reason"]
    assert "NVML GPM needs Hopper or later" in dram["reason"] and "dcgm-exporter" in dram["fix"]
    page = render_page(d.to_json())
    assert "Blind spots" in page and "hardware/dram_bandwidth_bound" in page
    blind = [
        s.labels
        for fam in text_string_to_metric_families(played.text)
        for s in fam.samples
        if s.name == "llmgpu_diagnosis_rule_blind" and s.value == 1
    ]
    assert {(b["rule"], b["gpu"], b["signal"]) for b in blind} == {
        (s["rule"], s["gpu"], s["signal"]) for s in spots
    }


def test_with_a_dcgm_exporter_nothing_is_blind() -> None:
    played = play(SCENARIOS / "decode-memory-bound-a100.yaml")
    assert played.last is not None
    d = played.last.get(Diagnosis)
    assert d is not None and d.to_json()["blind_spots"] == []
    assert "llmgpu_diagnosis_rule_blind{" not in played.text
    assert 'llmgpu_gpu_metric_source{gpu="0"' in played.text and 'source="dcgm"' in played.text
