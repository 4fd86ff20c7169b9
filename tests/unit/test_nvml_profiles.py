"""Collectors against driver and part profiles of the fake NVML: each test names the quirk."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from exporter.gpu_readings import Clocks, Memory, NvLink, Pcie, Power, Processes, Profiling, Xid
from exporter.sim import fakenvml
from exporter.sim.drivers import profile
from exporter.sim.gpu_models import MODELS
from exporter.sim.scenario import SIM_PID_BASE, unprovided_keys


def scenario(model: str = "H100-80GB-SXM", driver: str | None = None, count: int = 2, extra: str = "") -> str:
    drv = f", driver: {driver}" if driver else ""
    # only what the profile can report (the loader refuses the rest: R470 has no GPM)
    skip = unprovided_keys(MODELS[model], profile(model, driver))
    values = {
        "util": 0.8,
        "memory_used_ratio": 0.6,
        "sm_active": 0.5,
        "throttle_hw_thermal": 1,
        "nvlink_tx_bps": "1.8e+10",
        "pcie_tx_bps": "1.0e+9",
    }
    gpu = ", ".join(f"{k}: {v}" for k, v in values.items() if k not in skip)
    return f"""
gpus: {{count: {count}, model: {model}{drv}}}
engines: [{{name: a, gpus: [0, 1]}}, {{name: b, gpus: [0]}}, {{name: c, gpus: [0]}}]
phases:
  - {{name: p, duration: 100, gpu: {{{gpu}}}}}
{extra}"""


@pytest.mark.parametrize("driver", ["R470", "R535", "R550", "R580"])
def test_processes_are_read_right_on_every_branch(sim, driver: str) -> None:  # type: ignore[no-untyped-def]
    # R535 as first released writes 32-byte _v3 records (the binding reads 24 from 12.535.108
    # on); R470 has no _v3 symbol (the binding's unversioned wrapper raises
    # NVMLLibraryMismatchError).
    s = sim(scenario(driver=driver))
    procs = s.at(5).gpu(0).get(Processes)
    assert procs is not None and procs.count == 3
    pids = sorted(p.pid for p in procs.items)
    assert pids == [SIM_PID_BASE, SIM_PID_BASE + 100, SIM_PID_BASE + 200]
    used = {p.used_bytes for p in procs.items}
    assert len(used) == 1 and next(iter(used)) > 10 * 1024**3  # an equal share each, none garbled


@pytest.mark.parametrize(
    ("version", "record"),
    [("535.54.03", 32), ("535.86.10", 32), ("535.104.05", 24), ("535.216.03", 24), ("550.127.08", 24)],
)
def test_the_v3_record_size_follows_the_drivers_release(sim, version: str, record: int) -> None:  # type: ignore[no-untyped-def]
    """nvml.h of CUDA 12.2.0/12.2.1 (drivers 535.54, 535.86) had a 32-byte nvmlProcessInfo_t;
    12.2.2's (535.104) the 24-byte nvmlProcessInfo_v2_t again. The exporter reads _v3 (where
    a driver lacks _v2) with the size its release writes: no process garbled."""
    from exporter.sim.drivers import resolve_driver

    assert resolve_driver(version).process_v3_record == record
    s = sim(scenario().replace("model: H100-80GB-SXM", f'model: H100-80GB-SXM, driver: "{version}"'))
    s.at(1)
    nvml = s.exporter.nvml
    assert ctypes.sizeof(nvml._v3_record()) == record
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    procs = nvml._processes(fn, "v3", nvml.handle(0), nvml._v3_record())
    assert sorted(pid for pid, _ in procs) == [SIM_PID_BASE, SIM_PID_BASE + 100, SIM_PID_BASE + 200]
    assert len({used for _, used in procs}) == 1


def test_clock_reasons_fall_back_to_the_throttle_name_on_old_drivers(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(scenario(driver="R470"))
    clocks = s.at(5).gpu(0).get(Clocks)
    assert clocks is not None and clocks.event_active is not None
    assert clocks.event_active["hw_thermal"] == 1 and clocks.event_active["sw_power_cap"] == 0
    # R470 knows only the perf-policy counters (SW power cap, SW thermal): the HW slowdown
    # durations are absent, not zero
    assert clocks.event_seconds is not None and set(clocks.event_seconds) == {"sw_power_cap", "sw_thermal"}


def test_fields_newer_than_the_driver_are_absent(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(scenario(driver="R535"))
    g = s.at(5).gpu(0)
    pcie = g.get(Pcie)
    assert pcie is not None and pcie.tx_bytes is None and pcie.replays is not None
    assert g.up and "llmgpu_gpu_pcie_tx_bytes_total" not in s.text()
    assert g.facts is not None and g.facts.get("driver_version").startswith("535.")


def test_grace_numa_node_is_the_pci_node_with_cpus(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        scenario(model="GH200-96GB", count=4).replace("engines: [{name: a, gpus: [0, 1]}, ", "engines: [")
    )
    snap = s.at(5)
    for i in range(4):
        # nvmlDeviceGetNumaNodeId answers 4 + i (the GPU's memory, no CPUs); the PCI node is i
        assert snap.gpu(i).facts.get("numa_node") == str(i)


def test_numa_node_on_r535_comes_from_sysfs(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(scenario(driver="R535", count=4).replace("engines: [{name: a, gpus: [0, 1]}, ", "engines: ["))
    snap = s.at(5)
    assert [snap.gpu(i).facts.get("numa_node") for i in range(4)] == ["0", "0", "1", "1"]


def test_gpm_samples_are_freed_and_never_closer_than_100ms(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(scenario())
    lib = fakenvml.installed()
    s.at(1)
    first = s.at(2).gpu(0).get(Profiling)
    assert first is not None and first.sm_active_ratio == pytest.approx(0.5, rel=0.03)
    again = s.at(2.05).gpu(0).get(Profiling)  # 50 ms later: kept, not refused
    assert again == first
    status = {c.collector: c for c in s.runner.compose().collectors}
    assert status["gpm"].errors is None
    assert lib.gpm_samples_allocated == 4  # two per GPU
    s.exporter.runner.stop()
    assert lib.gpm_samples_allocated == 0


def test_gpm_state_is_freed_when_a_gpu_is_lost(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(scenario(extra="faults: [{kind: lost, gpu: 1, at: 10, until: 20}]"))
    lib = fakenvml.installed()
    s.at(5)
    assert lib.gpm_samples_allocated == 4
    s.at(12)
    assert lib.gpm_samples_allocated == 2
    s.at(25)
    s.at(26)
    assert lib.gpm_samples_allocated == 4 and s.at(27).gpu(1).get(Profiling) is not None


def test_gpm_sample_alloc_failing_fails_only_that_gpu(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        scenario(
            extra="faults: [{kind: error, function: nvmlGpmSampleAlloc, error: Memory, at: 0, until: 3}]"
        )
    )
    s.at(1)
    s.at(2)
    snap = s.at(5)
    assert snap.gpu(0).up and snap.gpu(1).up
    status = {c.collector: c for c in snap.collectors}
    assert set(status["gpm"].errors) == {"Memory"}  # counted by NVML error name, no crash
    s.at(6)
    assert s.at(7).gpu(0).get(Profiling) is not None  # allocated once the fault ended


def test_xid_inside_a_gpu_instance_is_counted_on_its_gpu(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("""
        gpus: {count: 2, model: A100-80GB-SXM}
        mig: {gpus: [1], instances: [{profile: 3g.40gb, memory_ratio: 0.5, sms: 42}]}
        phases: [{name: p, duration: 100}]
        faults: [{kind: xid, gpu: 1, xid: 43, at: 1, until: 100}]
    """)
    s.at(0)
    snap = s.at(2)
    assert snap.gpu(1).get(Xid).counts[43] == 1
    assert snap.gpu(0).get(Xid).counts[43] == 0


def test_an_event_no_gpu_is_known_for_is_counted(sim) -> None:  # type: ignore[no-untyped-def]
    from exporter.collectors.xid import XidCollector

    s = sim(scenario())
    xid = next(c for c in s.runner._slots if isinstance(c.collector, XidCollector)).collector
    xid.refresh()
    stranger = pynvml.c_nvmlDevice_t()
    assert xid._index_of(stranger) is None
    data = type("Data", (), {"device": stranger, "eventData": 13})()
    xid.nvml.query = lambda fn, *a: (
        data if fn is pynvml.nvmlEventSetWait_v2 else type(xid.nvml).query(xid.nvml, fn, *a)
    )  # type: ignore[method-assign]
    assert xid._take(0) == "event"
    assert xid.collect().errors == {"unmapped": 1}


def _nvlink_slot(s):  # type: ignore[no-untyped-def]
    from exporter.collectors.nvlink import NvLinkCollector

    return next(sl for sl in s.runner._slots if isinstance(sl.collector, NvLinkCollector))


def test_nvlink_reads_one_field_call_per_gpu(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(scenario(), metric_profile="full")
    lib = fakenvml.installed()
    slot = _nvlink_slot(s)
    before = lib.calls
    s.runner.run_collector(slot)  # the first run is a slow one: state and error counters too
    # per GPU: its handle, the link-count field, one field-values call for all 18 links, and
    # data CRC of links 12-17 (no field id past link 11); it was 5 calls per link (90). Those
    # answer InvalidArgument, so the handle is fetched again once to tell a bad argument
    # from a stale handle.
    assert lib.calls - before == 2 * (3 + 6 + 1)
    links = s.at(3).gpu(0).get(NvLink).links
    assert len(links) == 18 and all(p.up == 1 for p in links)
    assert set(links[0].errors) == {"replay", "recovery", "crc_flit", "crc_data"}
    assert set(links[17].errors) == {"replay", "recovery", "crc_flit"}


def _field_ids(slot, runner):  # type: ignore[no-untyped-def]
    """The (field id, scope) pairs of every field-values call one run of the collector makes."""
    asked: list[list[tuple[int, int]]] = []
    collector = slot.collector
    real = collector.field_values

    def spy(h, ids):  # type: ignore[no-untyped-def]
        asked.append(list(ids))
        return real(h, ids)

    collector.field_values = spy
    try:
        runner.run_collector(slot)
    finally:
        del collector.field_values
    return asked


def test_nvlink_bytes_are_the_drivers_all_link_sums_when_links_are_not_exposed(sim) -> None:  # type: ignore[no-untyped-def]
    from exporter.collectors.nvlink import SUMS
    from exporter.nvml import SCOPE_ALL_LINKS

    full = sim(scenario(), metric_profile="full").at(40).gpu(0).get(NvLink)
    s = sim(scenario())  # the default profile: per-GPU totals only
    s.at(40)
    slot = _nvlink_slot(s)
    for _ in range(3):  # past the slow run: two fields per GPU, the two sums
        asked = _field_ids(slot, s.runner)
    assert asked == [SUMS, SUMS]
    summed = s.at(40).gpu(0).get(NvLink)
    assert all(p.tx_bytes is None for p in summed.links) and summed.links_up == 18
    # the driver's sum is the links' sum, to the KiB each link rounds to
    assert summed.tx_bytes == pytest.approx(full.tx_bytes, abs=18 * 1024)
    assert summed.rx_bytes == pytest.approx(full.rx_bytes, abs=18 * 1024)
    assert summed.tx_bytes > 0 and SCOPE_ALL_LINKS == 2**32 - 1


def test_a_driver_refusing_the_all_link_scope_gets_the_links_summed(sim, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from exporter.collectors.nvlink import SUMS
    from exporter.nvml import SCOPE_ALL_LINKS

    real = fakenvml.FakeLibrary._field
    monkeypatch.setattr(
        fakenvml.FakeLibrary,
        "_field",
        lambda self, g, fid, scope: None if scope == SCOPE_ALL_LINKS else real(self, g, fid, scope),
    )
    s = sim(scenario())
    got = s.at(40).gpu(0).get(NvLink)
    assert got.tx_bytes is not None and got.tx_bytes == sum(p.tx_bytes for p in got.links)
    slot = _nvlink_slot(s)
    for _ in range(3):
        asked = _field_ids(slot, s.runner)
    assert len(asked) == 2 and all(len(a) == 36 and not set(a) & set(SUMS) for a in asked)


def test_mig_profile_without_monitor_permission(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("""
        gpus: {count: 2, model: A100-80GB-SXM, mig_monitor: false}
        mig: {gpus: [1], instances: [{profile: 3g.40gb, memory_ratio: 0.5, sms: 42}]}
        phases: [{name: p, duration: 100, gpu: {memory_used_ratio: 0.3}}]
    """)
    snap = s.at(5)
    assert snap.gpu(1).up and snap.gpu(0).up
    assert snap.gpu(1).get(Memory).used_bytes is None and snap.gpu(0).get(Memory).used_bytes is not None
    status = {c.collector: c for c in snap.collectors}
    assert status["memory"].errors == {"NoPermission": 1}


def test_power_brake_slowdown_is_not_thermal_throttling(sim) -> None:  # type: ignore[no-untyped-def]
    from exporter.diagnosis.frame import frame_of

    s = sim("""
        gpus: {count: 1, model: H100-80GB-SXM, driver: R470}
        phases: [{name: p, duration: 100, gpu: {util: 0.9, sm_clock_ratio: 0.4,
                  throttle_hw_slowdown: 1, throttle_power_brake: 1}}]
    """)
    g = frame_of(s.at(5)).gpus[0]
    assert g.throttle_reasons is not None and "hw_power_brake" in g.throttle_reasons
    assert "hw_slowdown" not in g.throttle_reasons  # explained by the brake, not by heat
    s2 = sim("""
        gpus: {count: 1, model: H100-80GB-SXM}
        phases: [{name: p, duration: 100, gpu: {util: 0.9, throttle_hw_slowdown: 1}}]
    """)
    assert "hw_slowdown" in frame_of(s2.at(5)).gpus[0].throttle_reasons


def test_processes_outside_the_host_pid_namespace_are_absent_not_zero(sim) -> None:  # type: ignore[no-untyped-def]
    # Without hostPID the driver lists none of the busy GPU's processes: a count of 0
    # would be a wrong zero. The family is absent and the self-metric says why.
    s = sim(scenario(extra="").replace("model: H100-80GB-SXM}", "model: H100-80GB-SXM, host_pid: false}"))
    snap = s.at(5)
    assert snap.gpu(0).up and snap.gpu(0).get(Processes) is None
    assert snap.gpu(0).supported["processes"] is False
    text = s.text()
    assert "llmgpu_gpu_processes{" not in text and "llmgpu_gpu_process_memory_used_bytes{" not in text
    assert "llmgpu_exporter_host_pid_namespace 0.0" in text
    host = sim(scenario())
    assert host.at(5).gpu(0).get(Processes).count == 3
    assert "llmgpu_exporter_host_pid_namespace 1.0" in host.text()


@pytest.mark.parametrize(
    ("driver", "ids"), [("R575", (252, 253)), ("R580", (252, 253)), ("R580.82", (270, 271))]
)
def test_hw_slowdown_durations_come_from_the_drivers_own_numbering(sim, driver: str, ids) -> None:  # type: ignore[no-untyped-def]
    # 580.65 numbers them 251-253 and answers power-smoothing settings at 269-271 (the
    # active profile, a floor in %, a ramp rate in mW/s); 580.82 on has them at 269-271.
    s = sim(f"""
        gpus: {{count: 1, model: H100-80GB-SXM, driver: {driver}}}
        phases: [{{name: hot, duration: 100, gpu: {{util: 0.9, throttle_hw_thermal: 1}}}}]
    """)
    s.at(5)
    clocks = s.at(25).gpu(0).get(Clocks)
    assert clocks.event_seconds["hw_thermal"] == pytest.approx(25, abs=0.1)
    # no power brake happened: 0, not the 2,000,000 mW/s ramp rate read as 2 ms
    assert clocks.event_seconds["hw_power_brake"] == 0.0
    assert fakenvml.installed().profile.driver.clock_events[1:] == ids


def test_a_driver_of_unknown_numbering_gets_no_hw_slowdown_durations(sim) -> None:  # type: ignore[no-untyped-def]
    # 580.76 lies between the last release with the old ids and the first with the new
    s = sim("""
        gpus: {count: 1, model: H100-80GB-SXM, driver: 580.76.05}
        phases: [{name: p, duration: 100, gpu: {util: 0.9, throttle_hw_thermal: 1, throttle_sw_thermal: 1}}]
    """)
    seconds = s.at(5).gpu(0).get(Clocks).event_seconds
    assert set(seconds) == {"sw_power_cap", "sw_thermal"} and seconds["sw_thermal"] == pytest.approx(
        5, abs=0.1
    )


def test_a_field_that_does_not_behave_like_a_duration_is_dropped(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("""
        gpus: {count: 1, model: H100-80GB-SXM}
        phases: [{name: p, duration: 100, gpu: {util: 0.9}}]
    """)
    clocks = next(sl.collector for sl in s.runner._slots if sl.collector.name == "clocks")
    reasons = {252: "hw_thermal", 253: "hw_power_brake"}
    s.clock.t = 10
    assert clocks._durations(0, reasons, {(252, 0): 1e9, (253, 0): 35.0}) == {
        "hw_thermal": 1.0,
        "hw_power_brake": 3.5e-8,
    }
    s.clock.t = 11
    # grew 5 s in 1 s of wall time: a setting, not a duration; the other still counts
    assert clocks._durations(0, reasons, {(252, 0): 6e9, (253, 0): 35.0}) == {"hw_power_brake": 3.5e-8}
    s.clock.t = 20
    assert clocks._durations(0, reasons, {(252, 0): 7e9, (253, 0): 20.0}) is None  # a fall too
    assert clocks._failed["NotADuration"] == 2


def test_the_hw_slowdown_ids_follow_the_driver_version() -> None:
    from exporter.nvml import hw_slowdown_fields

    assert hw_slowdown_fields("570.133.20") == {}
    assert (
        hw_slowdown_fields("575.64.05")
        == hw_slowdown_fields("580.65.06")
        == {"hw_thermal": 252, "hw_power_brake": 253}
    )
    assert (
        hw_slowdown_fields("580.82.07")
        == hw_slowdown_fields("595.80")
        == {"hw_thermal": 270, "hw_power_brake": 271}
    )
    assert hw_slowdown_fields("580.76.05") is None and hw_slowdown_fields("") is None


@pytest.mark.parametrize(
    ("driver", "read_v"), [("R580", True), ("R570", True), ("R550", False), ("R470", False)]
)
def test_temperature_is_read_with_the_call_that_replaces_the_deprecated_one(
    sim, driver: str, read_v: bool
) -> None:  # type: ignore[no-untyped-def]
    """nvml.h deprecates nvmlDeviceGetTemperature in CUDA 13.0 for nvmlDeviceGetTemperatureV
    (first in CUDA 12.8, R570). A fault on the new call alone shows which one is read."""
    fault = "faults: [{kind: error, function: nvmlDeviceGetTemperatureV, error: NoPermission, at: 0}]\n"
    s = sim(scenario(driver=driver, extra=fault))
    power = s.at(5).gpu(0).get(Power)
    read_v = read_v and hasattr(pynvml, "nvmlDeviceGetTemperatureV")  # bindings from 12.570
    assert (power.gpu_celsius is None) is read_v
    s2 = sim(scenario(driver=driver))
    assert s2.at(5).gpu(0).get(Power).gpu_celsius == pytest.approx(35, abs=2)  # the default temp_c
