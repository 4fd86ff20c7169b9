# mypy: disable-error-code="no-any-return"
"""The fake NVML library's compute processes and MIG instances: who runs where on a GPU."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml as N

from exporter.sim.drivers import DriverProfile
from exporter.sim.fake_handles import HANDLE_BASE, MIG_HANDLE_BASE, OK, _address, _out, _set_pointer, _val
from exporter.sim.scenario import GpuModel, Scenario, Timeline


class ProcessesAndMig:
    """Mixed into FakeLibrary: the scenario's engines as compute processes, MIG slices."""

    t: Timeline
    scn: Scenario
    model: GpuModel
    profile: DriverProfile

    def _gpu_of(self, handle: Any) -> int:
        raise NotImplementedError

    def _memory(self, g: int) -> tuple[int, int, int]:
        raise NotImplementedError

    def _processes(self, g: int) -> list[tuple[int, int]]:
        """The scenario's listed processes, then a worker of each engine on this GPU
        sharing the memory in use."""
        listed = list(self.scn.processes.get(g, ()))
        procs = [pids[g] for e in self.scn.engines if g in (pids := self.scn.engine_pids(e.name))]
        if not procs:
            return listed
        _, _, used = self._memory(g)
        return listed + [(pid, used // len(procs)) for pid in procs]

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: Any, count: Any, arr: Any) -> int:
        return self._write_processes(h, count, arr, 24)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h: Any, count: Any, arr: Any) -> int:
        return self._write_processes(h, count, arr, self.profile.driver.process_v3_record)

    def _write_processes(self, h: Any, count: Any, arr: Any, record: int) -> int:
        """Records of `record` bytes whatever the caller's array type, as the driver does:
        nvmlProcessInfo_v2_t is 24 bytes (pid, pad, usedGpuMemory, gpuInstanceId,
        computeInstanceId); R535's _v3 appends usedGpuCcProtectedMemory (32 bytes)."""
        procs = self._processes(self._gpu_of(h))
        n = _out(count)
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

    def _mig_instances(self, g: int) -> tuple[tuple[str, float, int], ...]:
        if self.scn.mig is None or g not in self.scn.mig.gpus:
            return ()
        return self.scn.mig.instances

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any, ref: Any) -> int:
        _out(ref).value = 7
        return OK

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, index: Any, ref: Any) -> int:
        g, i = self._gpu_of(h), _val(index)
        if i >= len(self._mig_instances(g)):
            return N.NVML_ERROR_NOT_FOUND
        _set_pointer(ref, MIG_HANDLE_BASE + g * 16 + i)
        return OK

    def _mig_slot(self, h: Any) -> tuple[int, int]:
        return divmod(_address(h) - MIG_HANDLE_BASE, 16)

    def _mig_memory(self, h: Any, ref: Any) -> int:
        g, slot = self._mig_slot(h)
        _, ratio, _ = self._mig_instances(g)[slot]
        total = int(self.model.memory_bytes * ratio)
        used = int(total * min(0.98, self.t.gpu(g, "memory_used_ratio")))
        out = _out(ref)
        out.total, out.used, out.free = total, used, total - used
        if hasattr(out, "reserved"):
            out.reserved = 0
        return OK

    def nvmlDeviceGetGpuInstanceId(self, h: Any, ref: Any) -> int:
        _out(ref).value = self._mig_slot(h)[1] + 1
        return OK

    def nvmlDeviceGetComputeInstanceId(self, h: Any, ref: Any) -> int:
        _out(ref).value = 0
        return OK

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h: Any, ref: Any) -> int:
        addr = _address(h)
        if addr < MIG_HANDLE_BASE:
            return N.NVML_ERROR_INVALID_ARGUMENT  # not a MIG device
        _set_pointer(ref, HANDLE_BASE + (addr - MIG_HANDLE_BASE) // 16)
        return OK

    def nvmlDeviceGetAttributes_v2(self, h: Any, ref: Any) -> int:
        g, slot = self._mig_slot(h)
        _out(ref).multiprocessorCount = self._mig_instances(g)[slot][2]
        return OK
