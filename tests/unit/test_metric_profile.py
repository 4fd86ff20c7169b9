"""The series budget: the default metric profile stays within 60 series per GPU on the
benchmark's 8 x H100 node and keeps every input of the dashboards, the alert and
recording rules and the diagnosis; the full profile and per-family switches add detail."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import catalog as names_catalog
from dashboards import generate
from dashboards.common import metric_names, queries
from exporter import app, catalog
from exporter.config import ConfigError, Settings, load
from exporter.diagnosis.frame import frame_of
from exporter.gpu_readings import NvLink, NvLinkPort
from exporter.metricdef import MetricDef
from exporter.sim.scenario import builtin_names
from exporter.snapshot import GpuState, Snapshot

ROOT = Path(__file__).resolve().parents[2]
BUDGET = 60  # series per GPU in the default profile
# The benchmark's reference node (bench/harness.py: write_scenario, STEADY): 8 H100 SXM
# under steady load, no engine.
BENCH_8XH100 = """
name: bench-8
gpus: {count: 8, model: H100-80GB-SXM}
phases:
  - name: steady
    duration: 86400
    gpu: {util: 0.75, mem_busy: 0.4, sm_active: 0.55, sm_occupancy: 0.35, tensor_active: 0.4,
          dram_active: 0.45, fp16_active: 0.05, fp32_active: 0.03, memory_used_ratio: 0.9,
          power_ratio: 0.6, temp_c: 62, mem_temp_c: 66, sm_clock_ratio: 0.95,
          pcie_tx_bps: 2.0e+8, pcie_rx_bps: 3.0e+8, nvlink_tx_bps: 6.0e+10, nvlink_rx_bps: 6.0e+10}
"""
GPU_SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*\{[^}]*uuid="GPU-')


def series_per_gpu(text: str, gpus: int) -> float:
    """Samples carrying a GPU's uuid, per GPU: what the benchmark counts."""
    return sum(1 for line in text.splitlines() if GPU_SAMPLE.match(line)) / gpus


def scrape(sim: Any, **settings: Any) -> str:
    s = sim(BENCH_8XH100, **settings)
    s.at(10)
    s.at(20)  # GPM compares two samples
    return str(s.text())


# ---- the budget ------------------------------------------------------------------------


def test_default_profile_is_within_budget_on_the_8xh100_node(sim) -> None:  # type: ignore[no-untyped-def]
    default = series_per_gpu(scrape(sim), 8)
    full = series_per_gpu(scrape(sim, metric_profile="full"), 8)
    assert 40 < default <= BUDGET, default
    assert full > 200, full  # 18 links x 7 per-link series on an H100, and the rest


def shipped_scrape(name: str, **settings: Any) -> tuple[str, int]:
    """A full scrape of a shipped scenario a minute in (two GPM samples, one processes run)."""
    from exporter.sim import node
    from exporter.sim.scenario import load_builtin

    clock = node.ManualClock()
    exporter = node.build(Settings(simulate=name, collectors_disabled=("allocator",), **settings), clock)
    try:
        for t in (0.0, 10.0, 60.0):
            clock.t = t
            exporter.step()
        assert exporter.runner.published is not None
        return exporter.runner.published.text.decode(), load_builtin(name).gpu_count
    finally:
        exporter.close()


# The series a GPU carries once per engine or process on it, not once per GPU: the
# engine-GPU join row, the engine's memory budget and its OOM score (one OOM score is the
# GPU's own), and each process' memory.
PER_TENANT = (
    "llmgpu_engine_gpu_info",
    "llmgpu_engine_gpu_memory_budget_bytes",
    "llmgpu_gpu_process_memory_used_bytes",
)
OOM = "llmgpu_diagnosis_oom_risk_ratio"


def split_per_gpu(text: str, gpus: int) -> tuple[float, float]:
    """(the GPU's own series, those of the engines and processes on it), per GPU."""
    lines = [line.split("{", 1)[0] for line in text.splitlines() if GPU_SAMPLE.match(line)]
    tenants = sum(1 for name in lines if name in PER_TENANT)
    oom = sum(1 for name in lines if name == OOM)
    extra_oom = max(0, oom - gpus)
    return (len(lines) - tenants - extra_oom) / gpus, (tenants + extra_oom) / gpus


@pytest.mark.slow
@pytest.mark.parametrize("name", builtin_names())
def test_default_profile_is_within_budget_on_every_shipped_scenario(name: str) -> None:
    """Each GPU's own series stay within the budget on every shipped scenario; each engine
    on a GPU adds three (join, budget, OOM score) and each process one, which the budget
    of a GPU cannot hold for every node: 62 on a GPU with one engine and its worker."""
    text, gpus = shipped_scrape(name)
    own, tenants = split_per_gpu(text, gpus)
    assert own <= BUDGET, own
    assert own + tenants == series_per_gpu(text, gpus)


@pytest.mark.slow
def test_the_shared_profile_adds_per_process_and_per_pod_series() -> None:
    default, gpus = shipped_scrape("shared-time-slicing")
    shared, _ = shipped_scrape("shared-time-slicing", metric_profile="shared")
    added = series_per_gpu(shared, gpus) - series_per_gpu(default, gpus)
    # three processes x (SM, memory activity) + three pods x (SM, memory, processes)
    assert added == 3 * 2 + 3 * 3


def test_a_profile_over_budget_is_caught(sim) -> None:  # type: ignore[no-untyped-def]
    # The per-link error counters alone are 18 links x 4 types per GPU.
    over = series_per_gpu(scrape(sim, metrics_enabled=("llmgpu_gpu_nvlink_link_errors_total",)), 8)
    assert over > BUDGET


# ---- what the dashboards and rules read --------------------------------------------------


def dashboard_names() -> set[str]:
    return {
        n for board in generate.boards().values() for _, q in queries(board) for n in metric_names(q.expr)
    }


def rule_names() -> set[str]:
    out: set[str] = set()
    for path in sorted((ROOT / "alerts").glob("*.rules.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                out |= set(metric_names(rule["expr"]))
    return out


def test_every_name_a_dashboard_or_rule_reads_is_in_the_default_profile() -> None:
    used = dashboard_names() | rule_names()
    assert {"llmgpu_gpu_nvlink_links_up", "llmgpu_gpu_nvlink_errors_total", "llmgpu_gpu_up"} <= used
    assert names_catalog.problems(sorted(used)) == []


def test_a_query_on_a_full_profile_name_is_caught() -> None:
    assert names_catalog.problems(["llmgpu_gpu_nvlink_link_up", "llmgpu_gpu_up"]) == [
        "llmgpu_gpu_nvlink_link_up: exposed by the full metric profile only, not by default"
    ]


# ---- what the diagnosis reads ----------------------------------------------------------


def _recorder(seen: set[tuple[type, str]]) -> Any:
    made: dict[type, type] = {}

    def wrap(reading: Any) -> Any:
        cls = type(reading)
        if not dataclasses.is_dataclass(reading) or isinstance(reading, type):
            return reading
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if cls not in made:

            def get(self: Any, name: str, _cls: type = cls, _fields: Any = fields) -> Any:
                if name in _fields:
                    seen.add((_cls, name))
                return object.__getattribute__(self, name)

            made[cls] = type(f"Recorded{cls.__name__}", (cls,), {"__getattribute__": get})
        copy = object.__new__(made[cls])
        copy.__dict__.update(reading.__dict__)
        for name, f in fields.items():
            if f.metadata.get("nested"):
                copy.__dict__[name] = tuple(wrap(x) for x in reading.__dict__[name])
        return copy

    return wrap


def diagnosis_inputs(snapshot: Snapshot) -> set[tuple[type, str]]:
    """(class, field) of every GPU reading field and GpuState field the frame reads."""
    seen: set[tuple[type, str]] = set()
    wrap = _recorder(seen)
    gpus = tuple(
        wrap(dataclasses.replace(g, readings={k: wrap(v) for k, v in g.readings.items()}))
        for g in snapshot.gpus
    )
    frame_of(dataclasses.replace(snapshot, gpus=gpus))
    return {(cls.__mro__[1] if cls.__name__.startswith("Recorded") else cls, name) for cls, name in seen}


def metric_of(cls: type, name: str) -> MetricDef | None:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    metric = f.metadata.get("metric")
    return metric if isinstance(metric, MetricDef) else None


NESTED_LABELS = {"pid", "mig_uuid"}  # labels the frame reads off nested readings' series
GPU_STATE = {
    "index": "llmgpu_gpu_up",  # the gpu label
    "uuid": "llmgpu_gpu_up",
    "up": "llmgpu_gpu_up",
    "supported": "llmgpu_gpu_metric_supported",
}


def full_profile_inputs(snapshots: list[Snapshot]) -> dict[str, str]:
    """Diagnosis inputs (by metric name) that only the full profile exposes."""
    profiles = {m.name: m.profile for m, _, _ in catalog.rows()}
    out: dict[str, str] = {}
    for snap in snapshots:
        for cls, name in diagnosis_inputs(snap):
            if cls is GpuState:
                metric = GPU_STATE.get(name)
                if metric is not None and profiles[metric] != "default":
                    out[metric] = f"GpuState.{name}"
                continue
            metric_def = metric_of(cls, name)
            if metric_def is None:
                # a label or a nested tuple: labels are carried by the class's own metrics
                own = [m for m in (metric_of(cls, f.name) for f in dataclasses.fields(cls)) if m]
                if name in NESTED_LABELS or (own and name != "links"):
                    assert any(m.profile == "default" for m in own), (cls, name)
                continue
            if metric_def.profile != "default":
                out[metric_def.name] = f"{cls.__name__}.{name}"
    return out


L4 = """
gpus: {count: 1, model: L4}
phases: [{name: p, duration: 100, gpu: {util: 0.5}}]
"""


@pytest.fixture
def snapshots(sim) -> Iterator[list[Snapshot]]:  # type: ignore[no-untyped-def]
    from tests.unit.test_catalog import REFERENCE_H100

    out = []
    for scenario in (REFERENCE_H100, L4):
        s = sim(scenario)
        s.at(10)
        out.append(s.at(20))
    yield out


def test_the_diagnosis_reads_only_default_profile_series_but_nvlink_support(snapshots) -> None:  # type: ignore[no-untyped-def]
    inputs = {name for snap in snapshots for _, name in diagnosis_inputs(snap)}
    # the recorder sees the reads: NVLink totals, the MIG instances, the GPU's state
    assert {"links_up", "tx_bytes", "instances", "memory_used_bytes", "labels", "supported"} <= inputs
    # Whether a GPU without NVLink lacks it (so a tensor-parallel engine runs over PCIe) is
    # the one input a diagnosis rebuilt from stored default-profile series has to take
    # from the GPU's model instead (docs/fleet.md).
    # Each process' SM share is the shared profile's (a fleet of shared GPUs stores it): the
    # noisy-neighbour rule reads it, and finds nothing where a store lacks it.
    assert full_profile_inputs(snapshots) == {
        "llmgpu_gpu_metric_supported": "GpuState.supported",
        "llmgpu_gpu_process_sm_utilization_ratio": "GpuProcess.sm_ratio",
    }


def test_node_readings_are_all_in_the_default_profile() -> None:
    for metric, labels, _ in catalog.rows():
        if "gpu" not in labels:
            assert metric.profile == "default", metric.name


# ---- the switches --------------------------------------------------------------------------


def test_families_switched_on_and_off_by_name(sim) -> None:  # type: ignore[no-untyped-def]
    text = scrape(
        sim,
        metrics_enabled=("llmgpu_gpu_nvlink_link_up",),
        metrics_disabled=("llmgpu_gpu_power_watts", "llmgpu_gpu_nvlink_link_up"),
    )
    assert "llmgpu_gpu_power_watts" not in text
    assert "llmgpu_gpu_nvlink_link_up" not in text  # off wins over on
    text = scrape(sim, metrics_enabled=("llmgpu_gpu_nvlink_link_up",))
    assert re.search(r'^llmgpu_gpu_nvlink_link_up\{gpu="0",link="17",uuid="GPU-[^"]+"\} 1\.0$', text, re.M)
    assert "llmgpu_gpu_nvlink_link_tx_bytes_total" not in text
    assert re.search(r'^llmgpu_gpu_nvlink_links_up\{gpu="0",uuid="GPU-[^"]+"\} 18\.0$', text, re.M)


def test_an_unknown_family_name_fails_before_anything_starts(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(L4)
    with pytest.raises(ConfigError, match=r"llmgpu_gpu_nvlink_up.*docs/metrics.md"):
        app.build(Settings(scenario_file=str(path), metrics_disabled=("llmgpu_gpu_nvlink_up",)))


def test_profile_setting_and_flags() -> None:
    with pytest.raises(ConfigError, match=r"metric-profile.*one of .default., .shared. or .full."):
        load({"metric_profile": "all"}, env={})
    from exporter.cli import parser, settings_from

    args = parser().parse_args(
        ["serve", "--metric-profile", "full", "--metric", "a", "--metric", "b", "--no-metric", "c"]
    )
    s = settings_from(args)
    assert (s.metric_profile, s.metrics_enabled, s.metrics_disabled) == ("full", ("a", "b"), ("c",))
    env = load({}, env={"LLMGPU_METRICS_DISABLED": "x,y", "LLMGPU_METRIC_PROFILE": "full"})
    assert (env.metric_profile, env.metrics_disabled) == ("full", ("x", "y"))


# ---- the NVLink totals ----------------------------------------------------------------------


def test_nvlink_totals_fold_the_links() -> None:
    two = NvLink(
        links=(
            NvLinkPort(link=0, up=1, tx_bytes=10, rx_bytes=5, errors={"replay": 2}),
            NvLinkPort(link=1, up=0, tx_bytes=20, rx_bytes=None, errors={"crc_flit": 1, "replay": 0}),
        )
    )
    assert (two.link_count, two.links_up, two.tx_bytes, two.rx_bytes, two.errors) == (2, 1, 30, 5, 3)
    unknown = NvLink(links=(NvLinkPort(link=0, tx_bytes=1),))
    assert (unknown.link_count, unknown.links_up, unknown.errors) == (None, None, None)
    assert NvLink(links=two.links, links_up=7).links_up == 7  # given totals are kept


# ---- the fleet view ----------------------------------------------------------------------------

PER_NODE = {"up", "llmgpu_exporter_build_info"}  # one series per node, whatever its GPUs


def test_fleet_panels_read_recorded_series_only() -> None:
    """The fleet dashboard's cost grows with nodes at most, never with GPUs: every query
    reads recording rules (or one series per node)."""
    board = next(b for p, b in generate.boards().items() if p.name == "fleet.dashboard.py")
    read = {n for _, q in queries(board) for n in metric_names(q.expr)}
    assert read - names_catalog.recorded() <= PER_NODE
    assert len(read & names_catalog.recorded()) >= 15
