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
