"""A scenario's shared GPUs: how they are handed out (time-slicing, MPS, DRA), the tenants
beside its engines, and who holds what at each instant.

```yaml
sharing:
  mode: time-slicing     # time-slicing | mps | dra
  replicas: 4            # time-slicing: replicas the device plugin advertises per GPU
  namespace: llm         # the namespace of the engines' pods (one pod per engine)
  tenants:
    - name: embed-batch  # its process' name and its pod's name
      gpus: [0]
      namespace: batch
      labels: {team: search}
      sm: [[0, 0.05], [120, 0.05], [200, 0.7]]   # (time, share of the GPU's SM time)
      memory: [[0, 0.05], [200, 0.3]]            # (time, share of the GPU's memory)
      until: 600                                 # the process and its pod end
```

The GPU's own values stay the phases': an engine's process holds what the GPU uses
beyond its tenants (SM time and memory, shared evenly between the engines on the GPU),
so the processes add up to the GPU. Under MPS the clients are listed by
nvmlDeviceGetMPSComputeRunningProcesses and the compute-process list holds only the MPS
server.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Mode = Literal["time-slicing", "mps", "dra"]
MODES: tuple[Mode, ...] = ("time-slicing", "mps", "dra")
TENANT_PID_BASE = 4_050_000  # beside the engines' simulated pids (scenario.SIM_PID_BASE)
MPS_SERVER_PID_BASE = 4_090_000
MPS_SERVER_BYTES = 256 * 1024 * 1024  # the server's own context
ENGINE_PROCESS = "python3"  # what an engine's worker is called
MPS_SERVER = "nvidia-cuda-mps-server"
Fail = Callable[[str, str], Exception]
Points = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class TenantSpec:
    name: str
    gpus: tuple[int, ...]
    namespace: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    sm: Points = ((0.0, 0.0),)
    memory: Points = ((0.0, 0.0),)
    until: float = float("inf")


@dataclass(frozen=True)
class SharingSpec:
    mode: Mode
    namespace: str = "llm"
    replicas: int = 4
    tenants: tuple[TenantSpec, ...] = ()


@dataclass(frozen=True)
class SimProcess:
    """One process on a simulated GPU now."""

    pid: int
    name: str
    used_bytes: int
    sm: float  # share of the GPU's SM time, 0-1
    memory_activity: float  # share of time the memory controller was busy for it, 0-1
    mps_client: bool = False


def at(points: Points, t: float) -> float:
    """The piecewise-linear value of (time, value) points at t, held before and after."""
    times = [p[0] for p in points]
    i = bisect.bisect_right(times, t)
    if i == 0:
        return points[0][1]
    if i >= len(points):
        return points[-1][1]
    (t0, v0), (t1, v1) = points[i - 1], points[i]
    return v1 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def tenant_pid(i: int, gpu: int) -> int:
    return TENANT_PID_BASE + 100 * i + gpu


def processes(
    spec: SharingSpec,
    t: float,
    gpu: int,
    engine_pids: Sequence[int],
    used_bytes: int,
    total_bytes: int,
    util: float,
    mem_busy: float,
) -> list[SimProcess]:
    """Every process on GPU `gpu` at scenario time t: tenants, then the engines' workers."""
    mps = spec.mode == "mps"
    out: list[SimProcess] = []
    for i, tenant in enumerate(spec.tenants):
        if gpu not in tenant.gpus or t >= tenant.until:
            continue
        sm = min(1.0, max(0.0, at(tenant.sm, t)))
        held = round(min(1.0, max(0.0, at(tenant.memory, t))) * total_bytes)
        busy = mem_busy * sm / util if util > 0 else 0.0
        out.append(SimProcess(tenant_pid(i, gpu), tenant.name, held, sm, min(1.0, busy), mps))
    if engine_pids:
        n = len(engine_pids)
        left_sm = max(0.0, util - sum(p.sm for p in out)) / n
        server = MPS_SERVER_BYTES if mps else 0
        left_bytes = max(0, used_bytes - server - sum(p.used_bytes for p in out)) // n
        busy = mem_busy * left_sm / util if util > 0 else 0.0
        out.extend(
            SimProcess(pid, ENGINE_PROCESS, left_bytes, left_sm, min(1.0, busy), mps) for pid in engine_pids
        )
    return out


def mps_server(gpu: int) -> SimProcess:
    return SimProcess(MPS_SERVER_PID_BASE + gpu, MPS_SERVER, MPS_SERVER_BYTES, 0.0, 0.0)


# ---- parsing ---------------------------------------------------------------------------


def _points(raw: Any, key: str, fail: Fail) -> Points:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return ((0.0, float(raw)),)
    try:
        points = tuple((float(a), float(b)) for a, b in raw)
    except (TypeError, ValueError):
        raise fail(key, "a ratio or a list of [time, ratio] pairs") from None
    if not points or any(b < 0 or b > 1 or a < 0 for a, b in points):
        raise fail(key, "[time >= 0, ratio 0-1] pairs, at least one")
    if [a for a, _ in points] != sorted(a for a, _ in points):
        raise fail(key, "pairs in time order")
    return points


def _name(raw: Any, key: str, fail: Fail) -> str:
    text = str(raw or "")
    if not text or len(text) > 63 or not all(c.isalnum() or c in "-." for c in text):
        raise fail(key, "a Kubernetes name (letters, digits, '-', '.'; at most 63)")
    return text


def parse(raw: Any, gpu_count: int, engines: Sequence[str], fail: Fail) -> SharingSpec | None:
    """The `sharing` key of a scenario; None when there is none."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise fail("sharing", "a mapping with mode, namespace, replicas and tenants")
    unknown = set(raw) - {"mode", "namespace", "replicas", "tenants"}
    if unknown:
        raise fail(f"sharing.{sorted(unknown)[0]}", "one of mode, namespace, replicas, tenants")
    mode = raw.get("mode")
    if mode not in MODES:
        raise fail("sharing.mode", f"one of {', '.join(MODES)}")
    replicas = raw.get("replicas", 4)
    if type(replicas) is not int or not 1 <= replicas <= 64:
        raise fail("sharing.replicas", "an integer from 1 to 64")
    tenants = []
    for i, t in enumerate(raw.get("tenants") or ()):
        where = f"sharing.tenants[{i}]"
        if not isinstance(t, dict):
            raise fail(where, "a mapping with name, gpus, namespace, labels, sm, memory, until")
        name = _name(t.get("name"), f"{where}.name", fail)
        if name in engines:
            raise fail(f"{where}.name", "a name no engine has")
        gpus = t.get("gpus", [0])
        if not isinstance(gpus, list) or not all(type(g) is int and 0 <= g < gpu_count for g in gpus):
            raise fail(f"{where}.gpus", f"a list of GPU indexes below {gpu_count}")
        labels = t.get("labels") or {}
        if not isinstance(labels, dict):
            raise fail(f"{where}.labels", "a mapping of pod labels")
        until = t.get("until", float("inf"))
        if not isinstance(until, int | float) or isinstance(until, bool) or until <= 0:
            raise fail(f"{where}.until", "a positive number of seconds")
        tenants.append(
            TenantSpec(
                name=name,
                gpus=tuple(gpus),
                namespace=_name(t.get("namespace", "default"), f"{where}.namespace", fail),
                labels={str(k): str(v) for k, v in labels.items()},
                sm=_points(t.get("sm", 0.0), f"{where}.sm", fail),
                memory=_points(t.get("memory", 0.0), f"{where}.memory", fail),
                until=float(until),
            )
        )
    return SharingSpec(
        mode=mode,
        namespace=_name(raw.get("namespace", "llm"), "sharing.namespace", fail),
        replicas=replicas,
        tenants=tuple(tenants),
    )
