"""The simulator's allocator probe files are what the probe reader accepts, with the values set."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pynvml
import pytest

from exporter.probe.reader import scan_probe_dir
from exporter.probe.schema import SCHEMA_VERSION, ProbeReport, file_name
from exporter.sim import fakenvml, node
from exporter.sim.probes import SCHEMA_VERSION as SIM_SCHEMA_VERSION
from exporter.sim.probes import SimProbes, gpu_uuid, probed_engines
from exporter.sim.scenario import Timeline, load_builtin, parse

SCENARIO = {
    "name": "probes",
    "gpus": {"count": 2},
    "engines": [{"name": "a", "gpus": [0, 1]}, {"name": "b", "gpus": [1]}],
    "phases": [
        {
            "name": "p",
            "duration": 100,
            "engines": {
                "a": {
                    "alloc_reserved_bytes": 8e9,
                    "alloc_free_bytes": 2e9,
                    "alloc_largest_free_bytes": 5e8,
                    "alloc_retry_rate": 0.5,
                    "alloc_oom_rate": 0.01,
                }
            },
        }
    ],
}


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def probes() -> Iterator[SimProbes]:
    clock = Clock()
    p = SimProbes(Timeline(parse(SCENARIO), clock=clock))
    clock.t = 60.0
    yield p
    p.stop()


def test_only_engines_a_phase_gives_an_allocator_have_probes() -> None:
    assert [e.name for e in probed_engines(parse(SCENARIO))] == ["a"]
    assert probed_engines(load_builtin("healthy")) == ()


def test_the_reader_accepts_every_file_with_the_timeline_values(probes: SimProbes) -> None:
    assert SIM_SCHEMA_VERSION == SCHEMA_VERSION
    assert probes.write() == 2  # engine a's two workers
    scan = scan_probe_dir(probes.directory, now=time.time(), max_age_s=120.0)
    assert scan.rejected == {} and scan.files_seen == 2
    pids = parse(SCENARIO).engine_pids("a")
    by_pid = {r.pid: r for r in scan.reports}
    assert set(by_pid) == set(pids.values())
    for gpu, pid in pids.items():
        r = by_pid[pid]
        assert r.state == "sampling" and r.cuda_available
        assert r.uuid == gpu_uuid(parse(SCENARIO), gpu)
        assert (r.reserved_bytes, r.large_free_bytes, r.largest_free_block_bytes) == (8e9, 2e9, 5e8)
        assert r.allocated_bytes == 6e9
        assert r.fragmentation_ratio == pytest.approx(0.75)
        assert (r.alloc_retries_total, r.ooms_total) == (30, 0)  # 0.5/s and 0.01/s over 60 s
        assert os.path.basename(file_name(r.pid, r.pid_namespace)) in os.listdir(probes.directory)
        assert ProbeReport.from_dict(r.to_dict()) == r


def test_no_temp_file_is_left_and_stop_removes_the_directory(probes: SimProbes) -> None:
    probes.write()
    assert all(not n.startswith(".") for n in os.listdir(probes.directory))
    probes.stop()
    assert not os.path.exists(probes.directory)


def test_probe_uuids_are_the_fake_nvml_ones() -> None:
    scn = parse(SCENARIO)
    fakenvml.install(Timeline(scn))
    try:
        pynvml.nvmlInit()
        for i in range(2):
            assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) == gpu_uuid(scn, i)
        pynvml.nvmlShutdown()
    finally:
        fakenvml.uninstall()


def test_a_simulation_reads_its_own_probe_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from exporter.allocator_readings import AllocatorProbes
    from exporter.config import Settings

    clock = node.ManualClock()
    ex = node.build(Settings(simulate="fragmented-allocator", probe_dir=str(tmp_path)), clock)
    try:
        assert ex.environment.settings.probe_dir != str(tmp_path)
        clock.t = 300.0
        snap = ex.step()
        probes = snap.get(AllocatorProbes)
        assert probes is not None and len(probes.processes) == 2
        assert {p.gpu for p in probes.processes} == {"0", "1"}
        assert all(p.largest_free_block_bytes == 260_000_000 for p in probes.processes)
    finally:
        ex.close()
    assert not os.path.exists(ex.environment.settings.probe_dir)
