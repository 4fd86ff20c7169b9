# mypy: disable-error-code="no-any-return"
"""The fake NVML library's processes area: the compute processes on a GPU, in the record
size the driver branch writes."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml as N

from exporter.sim.fakenvml import memory
from exporter.sim.fakenvml.abi import OK, Library, out, symbol


def running(lib: Library, g: int) -> list[tuple[int, int]]:
    """(pid, bytes): the scenario's listed processes, then a worker of each engine on
    this GPU sharing the memory in use; none for a caller outside the host's PID
    namespace, which sees none of them (drivers.DriverProfile.host_pid)."""
    scn = lib.scn
    if not lib.profile.host_pid:
        return []
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


def write_records(lib: Library, h: Any, count: Any, arr: Any, record: int) -> int:
    """Records of `record` bytes whatever the caller's array type, as the driver does:
    nvmlProcessInfo_v2_t is 24 bytes (pid, pad, usedGpuMemory, gpuInstanceId,
    computeInstanceId); early R535 drivers' _v3 appends usedGpuCcProtectedMemory (32 bytes)."""
    procs = running(lib, lib.gpu_of(h))
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
