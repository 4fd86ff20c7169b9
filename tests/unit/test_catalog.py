"""The catalog is the one list of metrics: no name declared twice, and no declared GPU
family that the reference simulated H100 claims without producing every metric of it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter import catalog
from exporter.gpu_readings import GPU_READINGS
from exporter.metricdef import gauge
from exporter.sim import fakenvml

# Two H100s: GPU 0 runs an engine (compute processes), GPU 1 is split with MIG, so every
# GPU family has something to show.
REFERENCE_H100 = """
name: reference-h100
gpus: {count: 2, model: H100-80GB-SXM}
mig:
  gpus: [1]
  instances: [{profile: 3g.40gb, memory_ratio: 0.5, sms: 60}]
engines: [{name: e, gpus: [0]}]
# GPU 0 time-sliced between the engine and a batch job: the per-pod families have owners
sharing:
  mode: time-slicing
  tenants: [{name: batch, gpus: [0], sm: 0.1, memory: 0.05}]
phases:
  - name: p
    duration: 100
    gpu: {util: 0.8, mem_busy: 0.4, sm_active: 0.6, tensor_active: 0.3, dram_active: 0.7,
          memory_used_ratio: 0.5, power_ratio: 0.5, temp_c: 70, pcie_tx_bps: 1.0e+9,
          nvlink_tx_bps: 1.8e+10}
"""


def gpu_families() -> dict[str, set[str]]:
    """family -> the catalog metric names that belong to it."""
    out: dict[str, set[str]] = {}
    for metric, _, family in catalog.rows():
        if family:
            out.setdefault(family, set()).add(metric.name)
    return out


def exposed(text: str) -> tuple[set[str], set[str]]:
    """(metric names with a GPU label, families some GPU says it supports)."""
    names: set[str] = set()
    supported: set[str] = set()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "gpu" not in s.labels:
                continue
            name = s.name if fam.type != "counter" else f"{fam.name}_total"
            names.add(name if fam.type != "info" else fam.name + "_info")
            if s.name == "llmgpu_gpu_metric_supported" and s.value == 1:
                supported.add(s.labels["family"])
    return names, supported


def missing(text: str) -> dict[str, set[str]]:
    """Per family some GPU claims: the catalog metrics of that family no GPU exposes."""
    names, supported = exposed(text)
    families = gpu_families()
    return {f: families[f] - names for f in sorted(supported) if families.get(f, set()) - names}


@pytest.fixture
def reference(sim) -> Iterator[str]:  # type: ignore[no-untyped-def]
    s = sim(REFERENCE_H100, metric_profile="full")
    s.at(10)
    s.at(20)  # GPM compares two samples
    yield s.text()


def test_the_reference_h100_claims_every_gpu_family(reference: str) -> None:
    _, supported = exposed(reference)
    assert supported == set(gpu_families()), "a GPU family the reference H100 does not claim"
    assert {cls.family for cls in GPU_READINGS} == set(gpu_families())


def test_the_reference_h100_produces_every_metric_of_the_families_it_claims(reference: str) -> None:
    assert missing(reference) == {}


def test_a_counter_without_a_fake_function_is_caught(sim, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    s = sim(REFERENCE_H100, metric_profile="full")
    # The fake library without the energy call: pynvml answers FunctionNotFound, as an old
    # driver would, and the energy counter is absent while its family is claimed.
    name = "nvmlDeviceGetTotalEnergyConsumption"
    monkeypatch.delattr(pynvml.nvmlLib, name)
    monkeypatch.delattr(fakenvml.FakeLibrary, name)
    pynvml._nvmlGetFunctionPointer_cache.clear()
    s.at(10)
    s.at(20)
    assert missing(s.text()) == {"power": {"llmgpu_gpu_energy_joules_total"}}


@dataclass(frozen=True)
class _OneGauge:
    used: float | None = gauge("llmgpu_gpu_memory_used_bytes", "a second declaration of a known name")


def test_a_metric_name_declared_twice_fails() -> None:
    with pytest.raises(catalog.DuplicateMetric, match=r"llmgpu_gpu_memory_used_bytes.*_OneGauge"):
        catalog.rows(extra=[_OneGauge])


def test_the_shipped_readings_declare_each_name_once() -> None:
    names = [m.name for m, _, _ in catalog.rows()]
    assert len(names) == len(set(names)) > 100
