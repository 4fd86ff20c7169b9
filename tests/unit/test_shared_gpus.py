"""Shared GPUs: each process' activity from NVML's sample buffer, MPS clients in the place
of their server, and each process' and pod's part of the GPU, through the fake library
and the exporter's own Kubernetes join."""

from __future__ import annotations

import re
from typing import Any

import pynvml
import pytest

from exporter.gpu_readings import Processes
from exporter.nvml import Nvml
from exporter.sim import fakenvml

pytestmark = pytest.mark.slow  # plays scenarios with a fake kubelet: `make unit` leaves it out

pytest.importorskip("grpc")

TIME_SLICED = """
gpus: {count: 1, model: L40S}
engines:
  - {name: chat-a, gpus: [0]}
  - {name: chat-b, gpus: [0]}
sharing:
  mode: time-slicing
  tenants:
    - {name: batch-job, gpus: [0], namespace: batch, labels: {team: search, tier: low},
       sm: [[0, 0.1], [50, 0.1], [60, 0.6]], memory: 0.25, until: 200}
phases:
  - name: p
    duration: 300
    gpu: {util: 0.8, mem_busy: 0.4, memory_used_ratio: 0.85}
"""
MPS = TIME_SLICED.replace("mode: time-slicing", "mode: mps")


def processes(snapshot: Any) -> Processes:
    found = snapshot.gpus[0].get(Processes)
    assert found is not None
    return found


def by_pod(p: Processes) -> dict[str, Any]:
    return {dict(t.owner)["pod"]: t for t in p.tenants}


def test_each_process_gets_its_sm_share_and_its_pod(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(TIME_SLICED, metric_profile="shared")
    s.at(10)
    p = processes(s.at(70))
    names = {i.process: i for i in p.items}
    assert names["batch-job"].sm_ratio == pytest.approx(0.6, abs=0.011)
    assert dict(names["batch-job"].owner) == {"namespace": "batch", "pod": "batch-job", "container": "main"}
    engines = [i for i in p.items if i.process == "python3"]
    assert [i.sm_ratio for i in engines] == pytest.approx([0.1, 0.1], abs=0.011)  # (0.8 - 0.6) / 2
    pods = by_pod(p)
    assert set(pods) == {"batch-job", "chat-a", "chat-b"}
    assert pods["chat-a"].processes == 1 and dict(pods["chat-a"].owner)["namespace"] == "llm"


def test_sample_buffer_protocol(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(TIME_SLICED)
    s.at(10)
    nvml: Nvml = s.exporter.nvml
    h = nvml.handle(0)
    every = nvml.process_utilization(h, 0)
    assert every and {pid for pid, *_ in every} >= {4_000_000, 4_000_100}
    newest = max(stamp for _, stamp, _, _ in every)
    # nothing newer than the newest sample: NVML_ERROR_NOT_FOUND, an empty answer
    assert nvml.process_utilization(h, newest) == []
    s.clock.t = 12.0
    newer = nvml.process_utilization(h, newest)
    assert newer and all(stamp > newest for _, stamp, _, _ in newer)
    assert len({stamp for _, stamp, _, _ in newer}) == 2  # one a second since the cursor


def test_the_older_call_serves_where_the_driver_lacks_the_newer(sim, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    s = sim(TIME_SLICED)
    name = "nvmlDeviceGetProcessesUtilizationInfo"
    monkeypatch.delattr(pynvml.nvmlLib, name)
    monkeypatch.delattr(fakenvml.FakeLibrary, name)
    pynvml._nvmlGetFunctionPointer_cache.clear()
    s.at(10)
    nvml: Nvml = s.exporter.nvml
    lib = fakenvml.installed()
    h = nvml.handle(0)
    before = lib.calls
    samples = nvml.process_utilization(h, 0)
    assert samples and {pid for pid, *_ in samples} >= {4_000_000, 4_000_100}
    assert lib.calls == before + 2  # nvmlDeviceGetProcessUtilization: the count, then the buffer


def test_mps_clients_stand_in_for_their_server(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(MPS, metric_profile="shared")
    s.at(10)
    p = processes(s.at(20))
    assert "nvidia-cuda-mps-server" not in {i.process for i in p.items}
    assert {i.process for i in p.items} == {"batch-job", "python3"}
    assert set(by_pod(p)) == {"batch-job", "chat-a", "chat-b"}
    # the compute-process list alone names only the server
    nvml: Nvml = s.exporter.nvml
    assert [nvml.process_name(pid) for pid, _ in nvml.compute_processes(nvml.handle(0)) or []] == [
        "nvidia-cuda-mps-server"
    ]


def test_per_process_and_per_pod_series_only_in_the_shared_profile(sim) -> None:  # type: ignore[no-untyped-def]
    for profile, shown in (("default", False), ("shared", True), ("full", True)):
        s = sim(TIME_SLICED, metric_profile=profile)
        s.at(10)
        s.at(20)
        text = s.text()
        assert ("llmgpu_gpu_process_sm_utilization_ratio{" in text) is shown, profile
        assert ("llmgpu_gpu_pod_sm_utilization_ratio{" in text) is shown, profile
        # the process' memory is a default series, now with its pod
        assert re.search(r'llmgpu_gpu_process_memory_used_bytes\{[^}]*pod="batch-job"', text), profile


# ---- who holds each GPU ---------------------------------------------------------------

DRA = """
gpus: {count: 2, model: L40S}
engines: [{name: llama, gpus: [0]}]
sharing:
  mode: dra
  tenants: [{name: finetune, gpus: [1], namespace: research, labels: {team: research}, sm: 0.5, memory: 0.4}]
phases: [{name: p, duration: 100, gpu: {util: 0.6, memory_used_ratio: 0.5}}]
"""


def gpu_labels(text: str, gpu: str) -> dict[str, str]:
    line = next(x for x in text.splitlines() if x.startswith("llmgpu_gpu_up{") and f'gpu="{gpu}"' in x)
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


def test_dra_claimed_gpus_carry_their_pod_and_claim(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(DRA, pod_labels="team")
    s.at(10)
    text = s.text()
    zero, one = gpu_labels(text, "0"), gpu_labels(text, "1")
    assert {k: zero[k] for k in ("namespace", "pod", "container", "claim")} == {
        "namespace": "llm",
        "pod": "llama",
        "container": "engine",
        "claim": "llama-gpu",
    }
    assert (one["pod"], one["claim"], one["label_team"]) == ("finetune", "finetune-gpu", "research")
    assert "label_team" not in zero  # the engine's pod has no such label; labels not allowed stay off
    assert "label_app" not in zero


def test_a_time_sliced_gpu_has_no_single_owner_but_each_pod_its_part(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(TIME_SLICED, metric_profile="shared")
    s.at(10)
    s.at(20)
    text = s.text()
    assert "pod" not in gpu_labels(text, "0")
    pods = re.findall(r'^llmgpu_gpu_pod_memory_used_bytes\{[^}]*pod="([^"]+)"', text, re.M)
    assert sorted(pods) == ["batch-job", "chat-a", "chat-b"]


# ---- the shipped scenarios ---------------------------------------------------------------

# Per-process SM shares are whole percent samples (NVML's smUtil), one per process: three
# tenants add up to the GPU's utilization within 1.5 points. Per-process memory adds up to
# the GPU's within 1 % of the GPU: a real driver keeps some memory of its own, outside any
# process (the fake: the MPS server's context, which belongs to no pod).
SM_TOLERANCE = 0.015
MEMORY_TOLERANCE_RATIO = 0.01


def played(name: str, step_s: float) -> list[Any]:
    from tests.unit.test_scenarios_findings import snapshots

    return list(snapshots(name, step_s))


def gpu_value(snapshot: Any, cls: type, attr: str) -> float:
    reading = snapshot.gpus[0].get(cls)
    return float(getattr(reading, attr))


@pytest.fixture(scope="module")
def time_sliced() -> list[Any]:
    return played("shared-time-slicing", 30.0)


def test_each_pods_share_adds_up_to_the_gpu(time_sliced: list[Any]) -> None:
    from exporter.gpu_readings import Memory, Utilization

    checked = 0
    for snap in time_sliced[1:]:
        pods = by_pod(processes(snap))
        assert set(pods) == {"nightly-embed", "chat-a", "chat-b"}
        util = gpu_value(snap, Utilization, "gpu_busy_ratio")
        assert sum(t.sm_ratio for t in pods.values()) == pytest.approx(util, abs=SM_TOLERANCE)
        total = snap.gpus[0].facts.memory_total_bytes
        used = gpu_value(snap, Memory, "used_bytes")
        held = sum(t.used_bytes for t in pods.values())
        assert abs(held - used) <= MEMORY_TOLERANCE_RATIO * total
        checked += 1
    assert checked >= 15


def test_the_noisy_neighbour_finding_names_the_batch_job_and_the_engine(time_sliced: list[Any]) -> None:
    from exporter.diagnosis.model import Diagnosis

    last = time_sliced[-1].get(Diagnosis)
    found = [f for f in last.findings if f.id == "scheduling/noisy_neighbour"]
    assert len(found) == 2  # both engines are slowed
    for f in found:
        evidence = {e.name: e.value for e in f.evidence}
        assert evidence["neighbour"] == "batch/nightly-embed"
        assert evidence["engine"] in ("llm/chat-a", "llm/chat-b")
        assert evidence["neighbour's share of the SM time used"] > 0.7
        assert "batch/nightly-embed" in f.detail
    # before the batch job grew, nothing
    early = time_sliced[5].get(Diagnosis)
    assert not [f for f in early.findings if f.id == "scheduling/noisy_neighbour"]


def test_the_oom_risk_names_the_tenant_that_grows() -> None:
    from exporter.diagnosis.model import Diagnosis

    last = played("shared-mps", 30.0)[-1].get(Diagnosis)
    (risk,) = {r.reasons[-1] for r in last.oom_risks}
    assert risk.startswith("3 processes share the GPU")
    assert "ml/feature-extractor holds" in risk and "more than 5 min ago" in risk


def test_an_ended_tenant_leaves_no_series_at_the_next_cycle(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(TIME_SLICED, metric_profile="shared")
    s.at(190)
    s.at(195)
    assert 'pod="batch-job"' in s.text()
    s.at(200)  # the tenant ends at 200: its process, its pod and its kubelet entry with it
    text = s.text()
    assert 'pod="batch-job"' not in text
    assert "batch-job" not in text


def test_a_claimed_gpu_loses_its_owner_when_the_pod_ends(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(DRA.replace("memory: 0.4}", "memory: 0.4, until: 50}"))
    s.at(45)
    assert gpu_labels(s.text(), "1")["claim"] == "finetune-gpu"
    s.at(50)  # the kubelet no longer lists the claim: the next cycle has no owner
    assert "claim" not in gpu_labels(s.text(), "1") and "pod" not in gpu_labels(s.text(), "1")
    assert gpu_labels(s.text(), "0")["pod"] == "llama"


def test_a_driver_before_r550_is_sampled_with_the_older_call(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(TIME_SLICED.replace("model: L40S}", "model: L40S, driver: R535}"), metric_profile="shared")
    s.at(10)
    p = processes(s.at(20))
    assert {i.process: i.sm_ratio for i in p.items}["batch-job"] == pytest.approx(0.1, abs=0.011)
    assert s.exporter.nvml._variant["process_utilization"] == 1  # the R550 call is not there


def test_a_version_the_driver_refuses_falls_back_to_the_older_call(sim, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from exporter import nvml as nvml_module

    s = sim(TIME_SLICED)
    monkeypatch.setattr(nvml_module, "PROCESSES_UTILIZATION_INFO_V1", 0x02000018)  # a v2 this driver lacks
    s.at(10)
    nvml: Nvml = s.exporter.nvml
    nvml._variant.pop("process_utilization", None)
    assert nvml.process_utilization(nvml.handle(0), 0)  # ArgumentVersionMismatch: the older call answered
    assert nvml._variant["process_utilization"] == 1
