# mypy: disable-error-code="no-any-return"
"""The fake NVML library's processes area: the compute processes on a GPU, in the record
size the driver branch writes; on a scenario's shared GPUs (sim/sharing.py) its tenants,
the MPS clients and each process' utilization samples."""

from __future__ import annotations

import ctypes
import math
from typing import Any

import pynvml as N

from exporter.sim.fakenvml import memory
from exporter.sim.fakenvml.abi import OK, Library, out, symbol, val
from exporter.sim.sharing import MPS_SERVER, SimProcess, mps_server
from exporter.sim.sharing import processes as shared_processes


def running(lib: Library, g: int) -> list[tuple[int, int]]:
    """(pid, bytes): the scenario's listed processes, then a worker of each engine on
    this GPU sharing the memory in use; none for a caller outside the host's PID
    namespace, which sees none of them (drivers.DriverProfile.host_pid)."""
    scn = lib.scn
    if not lib.profile.host_pid:
        return []
    if scn.sharing is not None:
        if scn.sharing.mode == "mps":
            return [(mps_server(g).pid, mps_server(g).used_bytes)] if sharing_now(lib, g) else []
        return [(p.pid, p.used_bytes) for p in sharing_now(lib, g)]
    listed = list(scn.processes.get(g, ()))
    procs = [pids[g] for e in scn.engines if g in (pids := scn.engine_pids(e.name))]
    if not procs:
        return listed
    _, _, used = memory.framebuffer(lib, g)
    return listed + [(pid, used // len(procs)) for pid in procs]


@symbol("nvmlDeviceGetComputeRunningProcesses_v2", mig_monitor=True)
def compute_running_processes_v2(lib: Library, h: Any, count: Any, arr: Any) -> int:
    return write_records(lib, h, count, arr, 24)


@symbol("nvmlDeviceGetComputeRunningProcesses_v3", mig_monitor=True)
def compute_running_processes_v3(lib: Library, h: Any, count: Any, arr: Any) -> int:
    return write_records(lib, h, count, arr, lib.profile.driver.process_v3_record)


def write_records(
    lib: Library, h: Any, count: Any, arr: Any, record: int, procs: list[tuple[int, int]] | None = None
) -> int:
    """Records of `record` bytes whatever the caller's array type, as the driver does:
    nvmlProcessInfo_v2_t is 24 bytes (pid, pad, usedGpuMemory, gpuInstanceId,
    computeInstanceId); early R535 drivers' _v3 appends usedGpuCcProtectedMemory (32 bytes)."""
    procs = running(lib, lib.gpu_of(h)) if procs is None else procs
    n = out(count)
    if arr is None:
        n.value = len(procs)
        return N.NVML_ERROR_INSUFFICIENT_SIZE if procs else OK
    if n.value < len(procs):
        n.value = len(procs)
        return N.NVML_ERROR_INSUFFICIENT_SIZE
    base = ctypes.addressof(arr)
    for i, (pid, mem) in enumerate(procs):
        at = base + i * record
        ctypes.c_uint.from_address(at).value = pid
        ctypes.c_ulonglong.from_address(at + 8).value = mem
        ctypes.c_uint.from_address(at + 16).value = 0xFFFFFFFF
        ctypes.c_uint.from_address(at + 20).value = 0xFFFFFFFF
        if record >= 32:
            ctypes.c_ulonglong.from_address(at + 24).value = 0
    n.value = len(procs)
    return OK


# ---- shared GPUs: tenants, MPS clients, per-process utilization --------------------------

SAMPLE_BASE_US = 1_700_000_000_000_000  # sample timestamps: scenario seconds on a fixed epoch, in us
SAMPLES_KEPT = 5  # samples per process the driver's buffer answers with at most, one a second


def sharing_now(lib: Library, g: int) -> list[SimProcess]:
    """The processes on shared GPU `g` now: its tenants, then its engines' workers."""
    scn = lib.scn
    assert scn.sharing is not None
    pids = [pids[g] for e in scn.engines if g in (pids := scn.engine_pids(e.name))]
    total, _, used = memory.framebuffer(lib, g)
    return shared_processes(
        scn.sharing, lib.t.now(), g, pids, used, total, lib.v(g, "util"), lib.v(g, "mem_busy")
    )


def process_name_of(lib: Library, pid: int) -> str | None:
    if lib.scn.sharing is None:
        return None
    for g in range(lib.scn.gpu_count):
        if pid == mps_server(g).pid and lib.scn.sharing.mode == "mps":
            return MPS_SERVER
        for p in sharing_now(lib, g):
            if p.pid == pid:
                return p.name
    return None


@symbol("nvmlSystemGetProcessName")
def system_process_name(lib: Library, pid: Any, name: Any, length: Any) -> int:
    found = process_name_of(lib, int(val(pid)))
    if found is None:
        return N.NVML_ERROR_NOT_FOUND
    raw = found.encode()[: int(val(length)) - 1]
    ctypes.memmove(name, raw + b"\0", len(raw) + 1)
    return OK


@symbol("nvmlDeviceGetMPSComputeRunningProcesses_v2")
def mps_running_processes_v2(lib: Library, h: Any, count: Any, arr: Any) -> int:
    return write_records(lib, h, count, arr, 24, mps_clients(lib, lib.gpu_of(h)))


@symbol("nvmlDeviceGetMPSComputeRunningProcesses_v3")
def mps_running_processes_v3(lib: Library, h: Any, count: Any, arr: Any) -> int:
    return write_records(
        lib, h, count, arr, lib.profile.driver.process_v3_record, mps_clients(lib, lib.gpu_of(h))
    )


def mps_clients(lib: Library, g: int) -> list[tuple[int, int]]:
    sharing = lib.scn.sharing
    if sharing is None or sharing.mode != "mps":
        return []
    return [(p.pid, p.used_bytes) for p in sharing_now(lib, g)]


def utilization_samples(lib: Library, g: int, since_us: int) -> list[tuple[int, int, int, int]]:
    """(pid, timestamp us, SM %, memory %) newer than the cursor: one a second per process
    that was active, the last SAMPLES_KEPT seconds of them. Only a scenario's shared GPUs
    have per-process values; elsewhere each engine's worker takes an even part of the GPU."""
    now = lib.t.now()
    if lib.scn.sharing is not None:
        procs = [(p.pid, p.sm, p.memory_activity) for p in sharing_now(lib, g)]
    else:
        pids = [pid for pid, _ in running(lib, g)]
        util, busy = lib.v(g, "util"), lib.v(g, "mem_busy")
        procs = [(pid, util / len(pids), busy / len(pids)) for pid in pids]
    out = []
    last = math.floor(now)
    for second in range(max(0, last - SAMPLES_KEPT + 1), last + 1):
        stamp = SAMPLE_BASE_US + second * 1_000_000
        if stamp <= since_us:
            continue
        for pid, sm, busy in procs:
            sm_pct, mem_pct = min(100, round(sm * 100)), min(100, round(busy * 100))
            if sm_pct or mem_pct:  # the driver keeps samples of active processes only
                out.append((pid, stamp, sm_pct, mem_pct))
    return out


@symbol("nvmlDeviceGetProcessUtilization")
def process_utilization(lib: Library, h: Any, arr: Any, count: Any, since: Any) -> int:
    """nvmlProcessUtilizationSample_t: pid, pad, timeStamp, smUtil, memUtil, encUtil, decUtil (32 bytes)."""
    samples = utilization_samples(lib, lib.gpu_of(h), int(val(since)))
    return _write_samples(samples, count, arr, 32, lambda at, s: _legacy_sample(at, s))


@symbol("nvmlDeviceGetProcessesUtilizationInfo")
def processes_utilization_info(lib: Library, h: Any, ref: Any) -> int:
    """nvmlProcessesUtilizationInfo_v1_t: version, processSamplesCount, lastSeenTimeStamp,
    procUtilArray of nvmlProcessUtilizationInfo_v1_t (timeStamp, pid, smUtil, memUtil, encUtil,
    decUtil, jpgUtil, ofaUtil: 40 bytes)."""
    info = out(ref)
    if info.version != 0x01000018:
        return N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    samples = utilization_samples(lib, lib.gpu_of(h), int(info.lastSeenTimeStamp))
    if not samples:
        return N.NVML_ERROR_NOT_FOUND
    if not info.procUtilArray or info.processSamplesCount < len(samples):
        info.processSamplesCount = len(samples)
        return N.NVML_ERROR_INSUFFICIENT_SIZE
    base = ctypes.cast(info.procUtilArray, ctypes.c_void_p).value or 0
    for i, (pid, stamp, sm, mem) in enumerate(samples):
        at = base + i * 40
        ctypes.memset(at, 0, 40)
        ctypes.c_ulonglong.from_address(at).value = stamp
        ctypes.c_uint.from_address(at + 8).value = pid
        ctypes.c_uint.from_address(at + 12).value = sm
        ctypes.c_uint.from_address(at + 16).value = mem
    info.processSamplesCount = len(samples)
    return OK


def _legacy_sample(at: int, s: tuple[int, int, int, int]) -> None:
    pid, stamp, sm, mem = s
    ctypes.memset(at, 0, 32)
    ctypes.c_uint.from_address(at).value = pid
    ctypes.c_ulonglong.from_address(at + 8).value = stamp
    ctypes.c_uint.from_address(at + 16).value = sm
    ctypes.c_uint.from_address(at + 20).value = mem


def _write_samples(samples: list[Any], count: Any, arr: Any, record: int, write: Any) -> int:
    """The sample-buffer protocol: NOT_FOUND without samples newer than the cursor; a null
    buffer or a short one gets the count and INSUFFICIENT_SIZE."""
    if not samples:
        return N.NVML_ERROR_NOT_FOUND
    n = out(count)
    if arr is None or n.value < len(samples):
        n.value = len(samples)
        return N.NVML_ERROR_INSUFFICIENT_SIZE
    base = ctypes.addressof(arr)
    for i, s in enumerate(samples):
        write(base + i * record, s)
    n.value = len(samples)
    return OK
