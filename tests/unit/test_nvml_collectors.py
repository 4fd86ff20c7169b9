"""Every NVML collector against the fake library: units, absence, and NVML error codes."""

from __future__ import annotations

import pynvml
import pytest

from exporter.gpu_readings import (
    Clocks,
    Ecc,
    Memory,
    Mig,
    NvLink,
    Pcie,
    Power,
    Processes,
    Profiling,
    Utilization,
    Xid,
)
from exporter.nvml import Nvml, NvmlError
from exporter.sim import fakenvml
from exporter.sim.gpu_models import MODELS

H100 = """
name: t
gpus: {count: 2, model: H100-80GB-SXM}
engines: [{name: e, gpus: [0, 1]}]
phases:
  - name: p
    duration: 100
    gpu: {util: 0.8, mem_busy: 0.4, sm_active: 0.6, tensor_active: 0.3, dram_active: 0.7,
          memory_used_ratio: 0.5, power_ratio: 0.5, temp_c: 70, pcie_tx_bps: 1.0e+9,
          nvlink_tx_bps: 1.8e+10, throttle_hw_thermal: 1}
"""


def test_readings_are_in_base_units(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(H100)
    s.at(10)
    snap = s.at(20)  # GPM compares two samples
    g = snap.gpu(0)
    assert g.up
    model = MODELS["H100-80GB-SXM"]
    assert g.get(Utilization).gpu_busy_ratio == pytest.approx(0.8, abs=0.03)
    mem = g.get(Memory)
    assert mem.used_bytes == pytest.approx(0.5 * model.memory_bytes, rel=0.01)
    assert mem.used_bytes + mem.free_bytes + mem.reserved_bytes == model.memory_bytes
    assert g.get(Power).usage_watts == pytest.approx(350, rel=0.03)
    assert g.get(Power).limit_watts == 700
    assert g.get(Profiling).sm_active_ratio == pytest.approx(0.6, rel=0.03)
    assert g.get(Profiling).dram_active_ratio == pytest.approx(0.7, rel=0.03)
    assert g.get(Clocks).event_active["hw_thermal"] == 1
    assert g.get(Clocks).event_active["sw_power_cap"] == 0
    assert g.get(Clocks).event_seconds["hw_thermal"] == pytest.approx(20, rel=0.01)
    # counters integrate the scenario's rates: 1 GB/s for 20 s
    assert g.get(Pcie).tx_bytes == pytest.approx(20e9, rel=0.01)
    links = g.get(NvLink).links
    assert len(links) == model.nvlinks and all(port.up == 1 for port in links)
    assert g.get(NvLink).tx_bytes == pytest.approx(18e9 * 20, rel=0.01)  # the driver's all-link sum
    assert g.facts.get("name") == model.name
    assert g.facts.uuid.startswith("GPU-")
    assert g.facts.dram_bandwidth_peak_bytes_per_second == 3350e9
    assert g.get(Processes).count == 1
    assert g.get(Mig).enabled == 0
    assert g.get(Xid).counts[79] == 0
    assert g.get(Ecc).uncorrected == 0


def test_older_gpu_leaves_unsupported_families_absent(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        """
        gpus: {count: 1, model: L4}
        phases: [{name: p, duration: 10, gpu: {util: 0.5}}]
    """,
        metric_profile="full",  # llmgpu_gpu_metric_supported is detail
    )
    s.at(1)
    g = s.at(2).gpu(0)
    assert g.get(Profiling) is None and g.supported["gpm"] is False
    assert g.get(NvLink) is None and g.supported["nvlink"] is False
    assert g.get(Mig) is None
    text = s.text()
    assert "llmgpu_gpu_sm_active_ratio" not in text
    assert 'llmgpu_gpu_metric_supported{family="gpm",gpu="0"' in text
    assert g.get(Utilization).gpu_busy_ratio == pytest.approx(0.5, abs=0.02)


def test_lost_gpu_goes_down_others_keep_going_and_it_recovers(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        H100
        + """
faults:
  - {kind: lost, gpu: 1, at: 30, until: 60}
"""
    )
    s.at(10)
    snap = s.at(40)
    assert snap.gpu(0).up and not snap.gpu(1).up
    assert snap.gpu(1).get(Memory) is None  # no stale numbers for a lost GPU
    assert snap.gpu(1).facts is not None  # its identity stays
    assert snap.gpu(0).get(Memory) is not None
    text = s.text()
    assert 'llmgpu_gpu_up{gpu="1"' in text and 'llmgpu_gpu_up{gpu="0"' in text
    assert 'llmgpu_exporter_collector_errors_total{collector="memory",error="GpuIsLost"}' in text
    snap = s.at(70)
    assert snap.gpu(1).up and snap.gpu(1).get(Memory) is not None


@pytest.mark.parametrize("error", ["Unknown", "Timeout", "NoPermission"])
def test_one_failing_function_takes_only_its_values(sim, error: str) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        H100
        + f"""
faults:
  - {{kind: error, function: nvmlDeviceGetPowerUsage, error: {error}, gpu: 0, at: 0, until: 50}}
"""
    )
    snap = s.at(5)
    g = snap.gpu(0)
    assert g.up and snap.gpu(1).up  # a function failing is not the GPU failing
    assert g.get(Power).usage_watts is None  # its own value is absent ...
    assert g.get(Power).energy_joules is not None and g.get(Power).gpu_celsius is not None  # ... only its own
    assert g.get(Memory) is not None and g.get(Clocks) is not None and g.supported["power"] is True
    status = {c.collector: c for c in snap.collectors}
    assert status["power"].success == 0 and status["power"].errors == {error: 1}
    assert status["memory"].success == 1
    text = s.text()
    assert f'llmgpu_exporter_collector_errors_total{{collector="power",error="{error}"}} 1.0' in text
    assert 'llmgpu_gpu_energy_joules_total{gpu="0"' in text
    assert 'llmgpu_gpu_power_watts{gpu="0"' not in text and 'llmgpu_gpu_power_watts{gpu="1"' in text
    assert s.at(60).gpu(0).get(Power).usage_watts is not None


def test_mig_parent_without_monitor_permission_stays_up(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        H100
        + """
faults:
  - {kind: error, function: nvmlDeviceGetMemoryInfo, error: NoPermission, at: 0}
"""
    )
    g = s.at(5).gpu(0)
    assert g.up
    assert g.get(Memory).used_bytes is None and g.get(Memory).bar1_total_bytes is not None
    assert g.get(Power) is not None and g.get(Utilization) is not None
    assert 'llmgpu_gpu_up{gpu="0",uuid="' in s.text() and "llmgpu_gpu_memory_used_bytes" not in s.text()


def test_not_supported_and_function_not_found_are_absent(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        H100
        + """
faults:
  - {kind: error, function: nvmlDeviceGetTotalEnergyConsumption, error: NotSupported, at: 0}
  - {kind: error, function: nvmlDeviceGetEnforcedPowerLimit, error: FunctionNotFound, at: 0}
"""
    )
    snap = s.at(5)
    power = snap.gpu(0).get(Power)
    assert snap.gpu(0).up
    assert power.energy_joules is None and power.limit_watts is None
    assert power.usage_watts is not None
    assert "llmgpu_gpu_energy_joules_total" not in s.text()


def test_memory_info_falls_back_when_v2_is_refused(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        H100
        + """
faults:
  - {kind: error, function: nvmlDeviceGetMemoryInfo_v2, error: ArgumentVersionMismatch, at: 0}
"""
    )
    mem = s.at(5).gpu(0).get(Memory)
    assert mem.used_bytes is not None and mem.reserved_bytes is None


@pytest.mark.slow
def test_xid_events_are_counted(sim) -> None:  # type: ignore[no-untyped-def]
    import time

    s = sim(
        H100
        + """
faults:
  - {kind: xid, gpu: 1, xid: 48, at: 0, until: 1000}
"""
    )
    s.runner.start()  # the XID collector waits for events on its own thread
    deadline = time.monotonic() + 5
    counts: dict[int, int] = {}
    while time.monotonic() < deadline:
        xid = s.at(1).gpu(1).get(Xid)
        counts = xid.counts if xid else {}
        if counts.get(48):
            break
        time.sleep(0.05)
    assert counts[48] == 1
    assert s.at(2).gpu(0).get(Xid).counts[48] == 0


def test_mig_instances(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim("""
        gpus: {count: 2, model: A100-80GB-SXM}
        mig: {gpus: [1], instances: [{profile: 3g.40gb, memory_ratio: 0.5, sms: 42},
                                     {profile: 3g.40gb, memory_ratio: 0.5, sms: 42}]}
        phases: [{name: p, duration: 10, gpu: {memory_used_ratio: 0.25}}]
    """)
    snap = s.at(1)
    assert snap.gpu(0).get(Mig).enabled == 0
    mig = snap.gpu(1).get(Mig)
    assert mig.enabled == 1 and len(mig.instances) == 2
    assert mig.instances[0].multiprocessors == 42
    assert mig.instances[0].memory_total_bytes == 40 * 1024**3
    assert snap.gpu(1).facts.get("mig_mode") == "enabled"


def test_nvml_layer_maps_errors_by_name() -> None:
    from exporter.sim.scenario import Timeline, parse

    timeline = Timeline(
        parse(
            {
                "gpus": {"count": 1},
                "phases": [{"duration": 10}],
                "faults": [{"kind": "lost", "gpu": 0, "at": 0}],
            }
        )
    )
    fakenvml.install(timeline)
    try:
        nvml = Nvml()
        with pytest.raises(NvmlError) as err:
            nvml.handle(0)
        assert err.value.name == "GpuIsLost"
        assert nvml.query(pynvml.nvmlDeviceGetCount) == 1
    finally:
        fakenvml.uninstall()


def test_no_driver_is_reported_clearly() -> None:
    from exporter.nvml import NvmlUnavailable

    fakenvml.uninstall()
    with pytest.raises(NvmlUnavailable, match="no NVIDIA driver"):
        Nvml()


def test_xid_of_a_gpu_that_falls_off_the_bus_is_kept(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        H100
        + """
faults:
  - {kind: xid, gpu: 1, xid: 79, at: 10, until: 11}
  - {kind: lost, gpu: 1, at: 10}
"""
    )
    s.at(5)
    snap = s.at(12)  # the other collectors drop the lost GPU's handle before the XID is read
    assert not snap.gpu(1).up
    assert snap.gpu(1).get(Xid).counts[79] == 1
    assert 'llmgpu_gpu_xid_errors_total{gpu="1",uuid="' in s.text()


def test_a_link_width_is_held_between_reads_then_read_again(sim) -> None:  # type: ignore[no-untyped-def]
    from exporter.collectors.gpu import HELD_S

    s = sim(
        """
        gpus: {count: 1, model: H100-80GB-SXM}
        phases:
          - {name: full, duration: 20, gpu: {pcie_link_width: 16}}
          - {name: downtrained, duration: 100, gpu: {pcie_link_width: 8}}
    """
    )
    assert HELD_S == 10.0
    first = s.at(15).gpu(0).get(Pcie)
    assert first.link_width == 16
    held = s.at(24).gpu(0).get(Pcie)  # downtrained by now, but read 9 s ago
    assert held.link_width == 16
    assert held.tx_bytes > first.tx_bytes  # the counters are read every run
    assert s.at(26).gpu(0).get(Pcie).link_width == 8
