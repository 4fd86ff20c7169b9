"""Every collector against every driver branch and part profile of the fake NVML.

For a healthy workload, on every profile: no GPU is reported down for a permission or
not-supported answer, a family the profile cannot provide is absent (never zero) and
`llmgpu_gpu_metric_supported` says so truthfully, and no finding comes from a quirk.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter import gpu_readings as R
from exporter.diagnosis.model import Diagnosis
from exporter.metricdef import has_value, metric_defs
from exporter.nvml import FI_PCIE_COUNT_TX_BYTES
from exporter.sim import fakenvml
from exporter.sim.drivers import DRIVERS, PARTS, profile
from exporter.sim.gpu_models import MODELS
from exporter.sim.scenario import SIM_PID_BASE, unprovided_keys

FAMILIES = {
    cls.family: cls
    for cls in (
        R.Utilization,
        R.Memory,
        R.Clocks,
        R.Power,
        R.Profiling,
        R.Pcie,
        R.NvLink,
        R.Ecc,
        R.Mig,
        R.Xid,
    )
}


def expected_families(model: str, driver: str) -> set[str]:
    """What a profile can provide, from its declaration rather than from the fake's code."""
    m, part, drv = MODELS[model], PARTS.get(model), DRIVERS[driver]
    absent = set()
    if not m.gpm or "nvmlGpmSampleGet" in drv.missing:
        absent.add("gpm")
    if m.nvlinks == 0:
        absent.add("nvlink")
    if part is not None and "nvmlDeviceGetMigMode" in part.not_supported:
        absent.add("mig")
    if part is not None and "nvmlDeviceGetTotalEccErrors" in part.not_supported:
        absent.add("ecc")
    return set(FAMILIES) - absent


HEALTHY_GPU = {
    "util": 0.7,
    "mem_busy": 0.4,
    "sm_active": 0.6,
    "tensor_active": 0.4,
    "dram_active": 0.5,
    "memory_used_ratio": 0.6,
    "power_ratio": 0.6,
    "temp_c": 62,
    "sm_clock_ratio": 0.95,
    "pcie_tx_bps": "1.0e+9",
    "nvlink_tx_bps": "1.0e+10",
}


def healthy(model: str, driver: str, extra: str = "") -> str:
    # a scenario may set only what the profile can report (the loader refuses the rest)
    skip = unprovided_keys(MODELS[model], profile(model, driver))
    gpu = ", ".join(f"{k}: {v}" for k, v in HEALTHY_GPU.items() if k not in skip)
    return f"""
gpus: {{count: 2, model: {model}, driver: {driver}{extra}}}
engines: [{{name: a, gpus: [0, 1]}}, {{name: b, gpus: [0, 1]}}]
phases:
  - {{name: p, duration: 300, gpu: {{{gpu}}}}}
"""


PROFILES = [(model, driver) for model in MODELS for driver in DRIVERS]


@pytest.mark.parametrize(("model", "driver"), PROFILES)
@pytest.mark.slow
def test_profile_conformance(sim, model: str, driver: str) -> None:  # type: ignore[no-untyped-def]
    s = sim(healthy(model, driver))
    lib = fakenvml.installed()
    snaps = [s.at(t) for t in (0, 5, 70, 140)]
    snap = snaps[-1]
    text = s.text()
    want = expected_families(model, driver)
    for g in snap.gpus:
        assert g.up, f"GPU {g.index} down on {model}/{driver}"
        for family, cls in FAMILIES.items():
            reading = g.get(cls)
            present = reading is not None and has_value(reading)
            assert present == (family in want), f"{family} on {model}/{driver}: present={present}"
            assert g.supported.get(family) is present, f"metric_supported for {family} on {model}/{driver}"
            if not present:
                for metric in metric_defs(cls):
                    assert f'{metric.name}{{gpu="{g.index}"' not in text, (
                        f"{metric.name} exposed on {model}/{driver}"
                    )
        # the clock-event mask exists on every branch, under one name or the other
        assert g.get(R.Clocks) is not None and g.get(R.Clocks).event_active is not None
        # two processes per GPU, neither garbled by a record size the binding got wrong
        procs = g.get(R.Processes)
        assert procs is not None and sorted(p.pid for p in procs.items) == [
            SIM_PID_BASE + g.index,
            SIM_PID_BASE + 100 + g.index,
        ]
        assert all(p.used_bytes and p.used_bytes > 0 for p in procs.items)
        # the NUMA node is one the CPUs are on (Grace: not the GPU's memory node)
        node = g.facts.get("numa_node")
        assert (
            node != "" and (Path(lib.sysfs) / f"devices/system/node/node{node}/cpulist").read_text().strip()
        )
    status = {c.collector: c for c in snap.collectors}
    assert {name: c.errors for name, c in status.items() if c.errors} == {}
    assert all(sn.get(Diagnosis) is not None for sn in snaps), "the Diagnoser ran on every cycle"
    findings = [f.id for sn in snaps for f in sn.get(Diagnosis).findings]
    assert findings == [], f"{model}/{driver}: {findings}"
    unknown = DRIVERS[driver].unknown_fields  # fields newer than the driver: absent, never zero
    assert ("llmgpu_gpu_pcie_tx_bytes_total" in text) is (FI_PCIE_COUNT_TX_BYTES not in unknown)
    if unknown:
        clocks = snap.gpu(0).get(R.Clocks)
        assert clocks is not None and "hw_thermal" not in (clocks.event_seconds or {})


def test_mig_without_monitor_permission_conforms(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        healthy("H100-80GB-SXM", "R550", ", mig_monitor: false")
        + "mig: {gpus: [0, 1], instances: [{profile: 3g.40gb, memory_ratio: 0.5, sms: 66}]}\n"
    )
    snaps = [s.at(t) for t in (0, 5, 70, 140)]
    snap = snaps[-1]
    for g in snap.gpus:
        assert g.up
        assert g.get(R.Memory).used_bytes is None  # refused, so absent
        assert g.get(R.Power) is not None and g.get(R.Mig).enabled == 1
    errors = {c.collector: c.errors for c in snap.collectors if c.errors}
    assert set(errors) <= {"memory", "processes", "device"} and all(
        set(e) == {"NoPermission"} for e in errors.values()
    )
    assert [f.id for sn in snaps if (d := sn.get(Diagnosis)) for f in d.findings] == []
