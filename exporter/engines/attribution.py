"""Which GPUs each engine runs on: an enricher joining engine process trees with NVML.

NVML lists the compute processes of every GPU (nvmlDeviceGetComputeRunningProcesses);
the engines collector knows each engine's process tree (API server, engine cores,
workers). A GPU belongs to an engine when one of its processes is in that tree. The
driver lists each GPU's processes by their pids in the caller's PID namespace and leaves
out those it cannot see there: in a pod, the exporter needs hostPID to see them all.
"""

from __future__ import annotations

from exporter.engines.readings import EngineGpu, EngineGpus, Engines
from exporter.gpu_readings import Processes
from exporter.snapshot import Snapshot


def engine_gpus(snapshot: Snapshot) -> tuple[object, ...]:
    """The llmgpu_engine_gpu_info join rows; nothing when no engine matches a GPU."""
    targets = [t for engines in snapshot.all(Engines) for t in engines.targets]
    if not targets:
        return ()
    links: list[EngineGpu] = []
    for gpu in snapshot.gpus:
        procs = gpu.get(Processes)
        if procs is None or not procs.items:
            continue
        on_gpu = {p.pid for p in procs.items}
        total = gpu.facts.memory_total_bytes if gpu.facts else None
        for target in targets:
            if not target.pids or not (target.pids & on_gpu):
                continue
            models = target.models or tuple(s.model for s in target.status if s.model) or (None,)
            for model in models:
                share = next(
                    (
                        s.gpu_memory_utilization
                        for s in target.series
                        if s.model == model and s.gpu_memory_utilization
                    ),
                    None,
                )
                links.append(
                    EngineGpu(
                        engine=target.kind or "unknown",
                        target=target.target,
                        model=model,
                        uuid=gpu.uuid,
                        gpu=str(gpu.index),
                        present=1,
                        memory_budget_bytes=share * total if share is not None and total else None,
                    )
                )
    return (EngineGpus(links=tuple(links)),) if links else ()
