"""The engine-GPU join: engine process trees against NVML's compute processes."""

from __future__ import annotations

from exporter.engines.attribution import engine_gpus
from exporter.engines.readings import (
    EngineGpus,
    Engines,
    EngineSeries,
    EngineTargetReading,
    EngineUp,
)
from exporter.gpu_readings import GpuProcess, Processes
from exporter.metricdef import samples
from exporter.snapshot import GpuState, Snapshot


def gpu(index: int, *pids: int) -> GpuState:
    procs = Processes(count=len(pids), items=tuple(GpuProcess(pid=p, process="python") for p in pids))
    return GpuState(index=index, uuid=f"GPU-{index:04d}", up=True, readings={Processes: procs})


def target(name: str, pids: set[int], model: str | None = "llama", kind: str = "vllm") -> EngineTargetReading:
    series = (EngineSeries(engine=kind, model=model, requests_running=1.0),) if model else ()
    return EngineTargetReading(
        target=name,
        status=(EngineUp(engine=kind, model=model, up=1),),
        series=series,
        kind=kind,
        pids=frozenset(pids),
    )


def snap(gpus: tuple[GpuState, ...], *targets: EngineTargetReading) -> Snapshot:
    return Snapshot(taken_at=0.0, gpus=gpus, node={Engines: (Engines(targets=targets),)})


def test_each_engine_gets_the_gpus_its_processes_hold() -> None:
    # engine A: API server 100, engine core 101, TP workers 102/103 on GPUs 0 and 1
    # engine B: one process 200 on GPU 2; GPU 3 runs something else
    s = snap(
        (gpu(0, 102), gpu(1, 103), gpu(2, 200), gpu(3, 999)),
        target("10.0.0.1:8000", {100, 101, 102, 103}),
        target("10.0.0.1:8001", {200}, model="qwen", kind="sglang"),
    )
    (join,) = engine_gpus(s)
    assert isinstance(join, EngineGpus)
    assert join.gpus_of("10.0.0.1:8000") == (0, 1)
    assert join.gpus_of("10.0.0.1:8001") == (2,)
    rows = {
        (dict(lbl)["target"], dict(lbl)["gpu"], dict(lbl)["uuid"], dict(lbl)["engine"])
        for _, lbl, _ in samples(join)
    }
    assert ("10.0.0.1:8001", "2", "GPU-0002", "sglang") in rows
    assert all(m.name == "llmgpu_engine_gpu_info" and v == 1 for m, _, v in samples(join))
    assert len(rows) == 3


def test_a_gpu_shared_by_two_engines_joins_both() -> None:
    s = snap((gpu(0, 10, 20),), target("a:1", {10}), target("b:2", {20}))
    (join,) = engine_gpus(s)
    assert join.gpus_of("a:1") == (0,) and join.gpus_of("b:2") == (0,)


def test_a_down_engine_keeps_its_last_model_in_the_join() -> None:
    down = EngineTargetReading(
        target="a:1",
        status=(EngineUp(engine="vllm", model="llama", up=0),),
        kind="vllm",
        pids=frozenset({10}),
    )
    (join,) = engine_gpus(snap((gpu(0, 10),), down))
    assert [link.model for link in join.links] == ["llama"]


def test_nothing_when_no_pid_matches_or_no_engines() -> None:
    assert engine_gpus(snap((gpu(0, 5),), target("a:1", {6}))) == ()
    assert engine_gpus(Snapshot(taken_at=0.0, gpus=(gpu(0, 5),))) == ()
    no_procs = GpuState(index=0, uuid="GPU-0", up=True)
    assert engine_gpus(snap((no_procs,), target("a:1", {5}))) == ()
