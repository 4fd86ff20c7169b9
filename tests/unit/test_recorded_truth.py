"""The exporter on the fake NVML library shows what nvidia-smi showed on real GPUs.

For every recording in tests/fixtures/nvidia-smi/, `smi_profile.scenario_of` builds a
scenario from the parsed output (the part inline, the recorded driver version, UUIDs,
bus ids, processes and readings); the exporter is built on it as `serve` and `snapshot`
build it and takes its samples. Every reading nvidia-smi recorded must then come out
equal at nvidia-smi's printed resolution (whole MiB, 0.01 W, whole MHz and degrees,
exact counts), in the snapshot and in the exposition, and every reading it printed as
N/A must be absent. A unit or a field the fake or a collector gets wrong fails here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter import cli, smi
from exporter.config import Settings
from exporter.gpu_readings import Clocks, DeviceFacts, Ecc, Memory, Pcie, Power, Processes, Utilization
from exporter.sim import node
from exporter.sim.scenario import ScenarioError, load_file
from exporter.smi_compare import THROTTLE_REASONS, compare
from exporter.smi_profile import scenario_of
from exporter.snapshot import GpuState, Snapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"
MIB = smi.MIB
# Recording -> the compute-apps CSV taken with it (None: -q -x lists its own processes,
# or nothing lists them).
RECORDINGS = {
    "a100-sxm4-80gb-535.54.03.xml": None,
    "a10g-515.105.01.xml": None,
    "t4-515.105.01.xml": None,
    "h100-80gb-hbm3-590.48.01-idle.query-gpu.csv": None,
    "h100-80gb-hbm3-590.48.01-load.query-gpu.csv": "h100-80gb-hbm3-590.48.01-load.compute-apps.csv",
    "h200-590.48.01-load.query-gpu.csv": None,
    "l40s-595.80-load.query-gpu.csv": "l40s-595.80-load.compute-apps.csv",
}


def read_log(name: str) -> smi.SmiLog:
    text = (FIXTURES / name).read_text()
    return smi.parse_xml(text) if name.endswith(".xml") else smi.parse_query_gpu_csv(text)


def read_processes(name: str) -> tuple[smi.SmiProcess, ...] | None:
    apps = RECORDINGS[name]
    return None if apps is None else smi.parse_compute_apps_csv((FIXTURES / apps).read_text())


@dataclass
class Played:
    log: smi.SmiLog
    processes: tuple[smi.SmiProcess, ...] | None
    first: Snapshot
    second: Snapshot
    text: str
    scenario_file: Path


def play(
    log: smi.SmiLog, processes: tuple[smi.SmiProcess, ...] | None, where: Path, name: str = "recorded"
) -> Played:
    """The exporter on the recording's scenario: two full samples, one second apart."""
    path = where / f"{name}.yaml"
    path.write_text(yaml.safe_dump(scenario_of(log, processes, name)))
    clock = node.ManualClock()
    # the full profile: every family nvidia-smi recorded is exposed, not only the default budget
    settings = Settings(
        scenario_file=str(path), collectors_disabled=("engines", "allocator"), metric_profile="full"
    )
    exporter = node.build(settings, clock)
    try:
        first = exporter.runner.step().snapshot
        clock.t = 1.0
        second = exporter.runner.step().snapshot
        assert exporter.runner.published is not None
        text = exporter.runner.published.text.decode()
    finally:
        exporter.close()
    return Played(log, processes, first, second, text, path)


@pytest.fixture(scope="module", params=sorted(RECORDINGS))
def played(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Played]:
    name: str = request.param
    yield play(read_log(name), read_processes(name), tmp_path_factory.mktemp("recorded"), Path(name).stem)


# ---- what must match ---------------------------------------------------------------------


def mismatches(theirs: smi.SmiGpu, g: GpuState, driver: str | None) -> list[str]:
    """Every recorded reading the exporter's GPU shows differently, at printed resolution."""
    facts = g.facts or DeviceFacts()
    mem, power, clocks, util = g.get(Memory), g.get(Power), g.get(Clocks), g.get(Utilization)
    ecc, pcie = g.get(Ecc), g.get(Pcie)
    rows = ecc.remapped_rows if ecc and ecc.remapped_rows is not None else None
    active = None if clocks is None or clocks.event_active is None else clocks.event_active
    pairs: list[tuple[str, Any, Any, float]] = [
        # name, exporter, nvidia-smi, largest difference the printed value hides
        ("name", facts.get("name"), theirs.name, 0),
        ("uuid", g.uuid, theirs.uuid, 0),
        ("PCI bus id", facts.get("pci_bus_id"), theirs.pci_bus_id, 0),
        ("driver version", facts.get("driver_version"), driver, 0),
        ("GPU busy", util and util.gpu_busy_ratio, theirs.gpu_busy_ratio, 0.001),
        ("memory busy", util and util.memory_busy_ratio, theirs.memory_busy_ratio, 0.001),
        ("memory total", facts.memory_total_bytes, theirs.memory_total_bytes, MIB - 1),
        ("memory used", mem and mem.used_bytes, theirs.memory_used_bytes, MIB - 1),
        ("memory reserved", mem and mem.reserved_bytes, theirs.memory_reserved_bytes, MIB - 1),
        ("memory free", mem and mem.free_bytes, theirs.memory_free_bytes, 3 * MIB),  # three roundings
        ("power draw", power and power.usage_watts, theirs.power_draw_watts, 0.005),
        ("power limit", power and power.limit_watts, theirs.power_limit_watts, 0.005),
        ("power limit max", facts.power_limit_max_watts, theirs.power_limit_max_watts, 0.005),
        ("SM clock", clocks and clocks.sm_hertz, theirs.sm_clock_hertz, 0),
        ("memory clock", clocks and clocks.memory_hertz, theirs.memory_clock_hertz, 0),
        ("SM clock max", facts.sm_clock_max_hertz, theirs.sm_clock_max_hertz, 0),
        ("memory clock max", facts.memory_clock_max_hertz, theirs.memory_clock_max_hertz, 0),
        ("GPU temperature", power and power.gpu_celsius, theirs.gpu_celsius, 0),
        ("memory temperature", power and power.memory_celsius, theirs.memory_celsius, 0),
        ("ECC corrected", ecc and ecc.corrected, theirs.ecc_corrected, 0),
        ("ECC uncorrected", ecc and ecc.uncorrected, theirs.ecc_uncorrected, 0),
        ("remapped correctable", rows and rows["correctable"], theirs.remapped_rows_correctable, 0),
        ("remapped uncorrectable", rows and rows["uncorrectable"], theirs.remapped_rows_uncorrectable, 0),
        ("remap pending", rows and ecc and ecc.remap_pending, _flag(theirs.remap_pending), 0),
        ("remap failed", rows and ecc and ecc.remap_failed, _flag(theirs.remap_failed), 0),
        ("PCIe generation max", facts.pcie_link_generation_max, theirs.pcie_generation_max, 0),
        ("PCIe width max", facts.pcie_link_width_max, theirs.pcie_width_max, 0),
        ("PCIe generation", pcie and pcie.link_generation, theirs.pcie_generation, 0),
        ("PCIe width", pcie and pcie.link_width, theirs.pcie_width, 0),
        (
            "clock events active",
            None if active is None else sorted(r for r, on in active.items() if on),
            None
            if theirs.clock_events_active is None
            else sorted(theirs.clock_events_active & THROTTLE_REASONS),
            0,
        ),
    ]
    wrong = []
    for name, ours, recorded, slack in pairs:
        if recorded is None:  # printed N/A: the exporter must leave it out, not show a zero
            if ours is not None:
                wrong.append(f"{name}: nvidia-smi printed N/A, the exporter shows {ours!r}")
        elif ours is None:
            wrong.append(f"{name}: nvidia-smi shows {recorded!r}, the exporter nothing")
        elif isinstance(recorded, int | float) and not isinstance(recorded, bool):
            if abs(float(ours) - float(recorded)) > slack:
                wrong.append(f"{name}: exporter {ours!r}, nvidia-smi {recorded!r}")
        elif ours != recorded:
            wrong.append(f"{name}: exporter {ours!r}, nvidia-smi {recorded!r}")
    return wrong


def _flag(value: bool | None) -> int | None:
    return None if value is None else int(value)


def test_every_recording_is_played() -> None:
    recordings = {p.name for p in FIXTURES.iterdir() if p.suffix == ".xml" or "query-gpu" in p.name}
    apps = {p.name for p in FIXTURES.iterdir() if "compute-apps" in p.name}
    assert recordings == set(RECORDINGS)
    assert apps == {a for a in RECORDINGS.values() if a}


def test_each_recorded_reading_matches(played: Played) -> None:
    assert len(played.second.gpus) == len(played.log.gpus)
    for g, theirs in zip(played.second.gpus, played.log.gpus, strict=True):
        assert g.up
        assert mismatches(theirs, g, played.log.driver_version) == []


def test_selfcheck_comparison_passes(played: Played) -> None:
    """`selfcheck`'s own comparison: nothing fails or warns; it skips only what neither side has."""
    checks = compare(played.first, played.second, played.log, played.processes)
    assert [c for c in checks if c.status in ("fail", "warn")] == []
    skipped = {c.detail for c in checks if c.status == "skip"}
    assert skipped <= {
        "neither reports memory temperature",
        "neither reports remapped rows",
        "nvidia-smi does not report compute processes",
    }


def test_recorded_processes_are_the_exporters(played: Played) -> None:
    theirs = played.processes
    if theirs is None:
        theirs = tuple(p for g in played.log.gpus for p in g.processes or ())
    want = sorted((p.pid, p.used_memory_bytes) for p in theirs if p.compute)
    got = []
    for g in played.second.gpus:
        procs = g.get(Processes)
        got += [(p.pid, p.used_bytes) for p in (procs.items if procs else ())]
    assert sorted(got) == want


def _samples(text: str) -> dict[tuple[str, str], float]:
    """(metric sample name, gpu label) -> value; gauges with a `reason` label are keyed by it."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "gpu" in s.labels and not {"link", "pid", "mig"} & set(s.labels):
                key = s.labels.get("reason") or s.labels.get("cause") or ""
                out[(s.name + (f"/{key}" if key else ""), s.labels["gpu"])] = s.value
    return out


def test_exposition_carries_the_recorded_values(played: Played) -> None:
    """The same readings in /metrics, in base units."""
    samples = _samples(played.text)
    for i, t in enumerate(played.log.gpus):
        gpu = str(i)
        expected: dict[str, float | None] = {
            "llmgpu_gpu_utilization_ratio": t.gpu_busy_ratio,
            "llmgpu_gpu_memory_busy_ratio": t.memory_busy_ratio,
            "llmgpu_gpu_memory_total_bytes": t.memory_total_bytes,
            "llmgpu_gpu_memory_used_bytes": t.memory_used_bytes,
            "llmgpu_gpu_memory_reserved_bytes": t.memory_reserved_bytes,
            "llmgpu_gpu_power_watts": t.power_draw_watts,
            "llmgpu_gpu_power_limit_watts": t.power_limit_watts,
            "llmgpu_gpu_sm_clock_hertz": t.sm_clock_hertz,
            "llmgpu_gpu_memory_clock_hertz": t.memory_clock_hertz,
            "llmgpu_gpu_temperature_celsius": t.gpu_celsius,
            "llmgpu_gpu_memory_temperature_celsius": t.memory_celsius,
            "llmgpu_gpu_pcie_link_generation": t.pcie_generation,
            "llmgpu_gpu_pcie_link_width": t.pcie_width,
            "llmgpu_gpu_ecc_corrected_errors_total": t.ecc_corrected,
            "llmgpu_gpu_ecc_uncorrected_errors_total": t.ecc_uncorrected,
            "llmgpu_gpu_remapped_rows/correctable": t.remapped_rows_correctable,
            "llmgpu_gpu_remapped_rows/uncorrectable": t.remapped_rows_uncorrectable,
            "llmgpu_gpu_row_remap_pending": _flag(t.remap_pending),
            "llmgpu_gpu_row_remap_failed": _flag(t.remap_failed),
        }
        for reason in THROTTLE_REASONS:  # every reason the exporter knows, active or not
            on = None if t.clock_events_active is None else float(reason in t.clock_events_active)
            expected[f"llmgpu_gpu_clock_event_active/{reason}"] = on
        for name, value in expected.items():
            shown = samples.get((name, gpu))
            if value is None:
                assert shown is None, f"{name} exposed for a reading nvidia-smi printed N/A"
                continue
            assert shown is not None, f"{name} missing on GPU {gpu}"
            slack = MIB - 1 if name.endswith("_bytes") else 0.005
            assert abs(shown - value) <= slack, f"{name}: exposed {shown}, nvidia-smi {value}"


def test_the_snapshot_command_shows_the_recording(played: Played, capsys: pytest.CaptureFixture[str]) -> None:
    """`llm-gpu-exporter snapshot --json --scenario-file ...`, the command a person runs."""
    code = cli.main(["snapshot", "--json", "--scenario-file", str(played.scenario_file), "--interval", "0.1"])
    assert code == 0
    shown = json.loads(capsys.readouterr().out)
    for g, theirs in zip(shown["gpus"], played.log.gpus, strict=True):
        r = g["readings"]
        assert g["uuid"] == theirs.uuid
        assert abs(r["Memory"]["used_bytes"] - (theirs.memory_used_bytes or 0)) < MIB
        assert r["DeviceFacts"]["memory_total_bytes"] == theirs.memory_total_bytes
        assert r["Power"]["usage_watts"] == pytest.approx(theirs.power_draw_watts, abs=0.005)
        assert r["Clocks"]["sm_hertz"] == theirs.sm_clock_hertz
        assert r["Power"]["gpu_celsius"] == theirs.gpu_celsius
        assert r["Pcie"]["link_generation"] == theirs.pcie_generation
        assert r["Pcie"]["link_width"] == theirs.pcie_width


# ---- the glue on readings the recordings happen not to hold --------------------------------


def test_counts_throttling_and_a_trained_down_link_are_reproduced(tmp_path: Path) -> None:
    """The recordings hold no errors or throttling: the same GPU with some must match too."""
    log = read_log("h100-80gb-hbm3-590.48.01-load.query-gpu.csv")
    g = dataclasses.replace(
        log.gpus[0],
        ecc_corrected=17,
        ecc_uncorrected=2,
        remapped_rows_correctable=3,
        remapped_rows_uncorrectable=1,
        remap_pending=True,
        pcie_generation=2,
        pcie_width=8,
        clock_events_active=frozenset({"sw_power_cap", "hw_slowdown"}),
    )
    changed = dataclasses.replace(log, gpus=(g,))
    run = play(changed, None, tmp_path)
    assert mismatches(g, run.second.gpus[0], log.driver_version) == []
    checks = compare(run.first, run.second, changed, None)
    assert [c for c in checks if c.status in ("fail", "warn")] == []


def test_a_reading_the_fake_cannot_hold_is_refused() -> None:
    log = read_log("a10g-515.105.01.xml")
    g = dataclasses.replace(log.gpus[0], clock_events_active=frozenset({"sync_boost"}))
    with pytest.raises(smi.SmiError, match="sync_boost"):
        scenario_of(dataclasses.replace(log, gpus=(g,)))
    g = dataclasses.replace(log.gpus[0], power_limit_watts=250.0)
    with pytest.raises(smi.SmiError, match="below the maximum"):
        scenario_of(dataclasses.replace(log, gpus=(g,)))


def _without_memory(gpus: dict[str, Any]) -> None:
    del gpus["model"]["memory_bytes"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_without_memory, "gpus.model.memory_bytes"),
        (lambda gpus: gpus["model"].update(colour="red"), "gpus.model.colour"),
        (lambda gpus: gpus["model"].update(memory_bytes="lots"), "gpus.model.memory_bytes"),
        (lambda gpus: gpus["model"].update(not_supported=["GetPower"]), "NVML function names"),
        (lambda gpus: gpus["model"].update(fields_not_supported=["FI_NOPE"]), "FI_NOPE"),
        (lambda gpus: gpus.update(driver="R999"), "gpus.driver"),
        (lambda gpus: gpus.update(driver="410.48"), "from 470 on"),
        (lambda gpus: gpus.update(cuda="twelve"), "CUDA version"),
        (lambda gpus: gpus.update(uuids=["GPU-1", "GPU-2"]), "gpus.uuids"),
        (lambda gpus: gpus.update(processes={5: [{"pid": 1, "used_memory_bytes": 1}]}), "gpus.processes"),
        (lambda gpus: gpus.update(processes={0: [{"pid": 1}]}), "gpus.processes"),
    ],
)
def test_a_bad_recorded_gpu_description_names_its_key(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], message: str
) -> None:
    data = scenario_of(read_log("a10g-515.105.01.xml"))
    change(data["gpus"])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ScenarioError, match=message):
        load_file(path)


def test_the_driver_version_picks_its_branch(tmp_path: Path) -> None:
    for version, branch, cuda in (
        ("515.105.01", "R515", 11070),
        ("535.54.03", "R535", 12020),
        ("580.76.05", "R580", 13000),
        ("590.48.01", "R580.82", 13000),
    ):
        data = scenario_of(read_log("a10g-515.105.01.xml"))
        data["gpus"]["driver"] = version
        data["gpus"].pop("cuda")
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump(data))
        driver = load_file(path).profile.driver
        assert (driver.branch, driver.version, driver.cuda) == (branch, version, cuda)
