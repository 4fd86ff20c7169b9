# mypy: disable-error-code="no-any-return"
"""The fake NVML library's MIG area: MIG mode, the MIG devices of a GPU (handles
`abi.mig_handle(gpu, slot)`), their instance ids, slice memory and SM counts."""

from __future__ import annotations

from typing import Any

import pynvml as N

from exporter.sim.fakenvml.abi import (
    HANDLE_BASE,
    MIG_HANDLE_BASE,
    MIG_SLOTS,
    OK,
    Library,
    address,
    mig_handle,
    mig_slot,
    out,
    set_pointer,
    symbol,
    val,
)
from exporter.sim.scenario import Scenario


def mig_on(scn: Scenario, gpu: int) -> bool:
    return scn.mig is not None and gpu in scn.mig.gpus


def instances(scn: Scenario, g: int) -> tuple[tuple[str, float, int], ...]:
    """(profile, memory ratio, SMs) of each GPU instance of GPU `g`."""
    if scn.mig is None or g not in scn.mig.gpus:
        return ()
    return scn.mig.instances


def memory_info(lib: Library, h: Any, ref: Any) -> int:
    """nvmlDeviceGetMemoryInfo(_v2) of a MIG device: its slice, with nothing reserved."""
    g, slot = mig_slot(address(h))
    _, ratio, _ = instances(lib.scn, g)[slot]
    total = int(lib.model.memory_bytes * ratio)
    used = int(total * min(0.98, lib.t.gpu(g, "memory_used_ratio")))
    info = out(ref)
    info.total, info.used, info.free = total, used, total - used
    if hasattr(info, "reserved"):
        info.reserved = 0
    return OK


@symbol("nvmlDeviceGetMigMode")
def mig_mode(lib: Library, h: Any, cur: Any, pending: Any) -> int:
    on = int(mig_on(lib.scn, lib.gpu_of(h)))
    out(cur).value = on
    out(pending).value = on
    return OK


@symbol("nvmlDeviceGetMaxMigDeviceCount")
def max_mig_device_count(lib: Library, h: Any, ref: Any) -> int:
    out(ref).value = 7
    return OK


@symbol("nvmlDeviceGetMigDeviceHandleByIndex")
def mig_device_handle_by_index(lib: Library, h: Any, index: Any, ref: Any) -> int:
    g, i = lib.gpu_of(h), val(index)
    if i >= len(instances(lib.scn, g)):
        return N.NVML_ERROR_NOT_FOUND
    set_pointer(ref, mig_handle(g, i))
    return OK


@symbol("nvmlDeviceGetGpuInstanceId")
def gpu_instance_id(lib: Library, h: Any, ref: Any) -> int:
    out(ref).value = mig_slot(address(h))[1] + 1
    return OK


@symbol("nvmlDeviceGetComputeInstanceId")
def compute_instance_id(lib: Library, h: Any, ref: Any) -> int:
    out(ref).value = 0
    return OK


@symbol("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
def device_handle_from_mig_device_handle(lib: Library, h: Any, ref: Any) -> int:
    addr = address(h)
    if addr < MIG_HANDLE_BASE:
        return N.NVML_ERROR_INVALID_ARGUMENT  # not a MIG device
    set_pointer(ref, HANDLE_BASE + (addr - MIG_HANDLE_BASE) // MIG_SLOTS)
    return OK


@symbol("nvmlDeviceGetAttributes_v2")
def attributes(lib: Library, h: Any, ref: Any) -> int:
    g, slot = mig_slot(address(h))
    out(ref).multiprocessorCount = instances(lib.scn, g)[slot][2]
    return OK
