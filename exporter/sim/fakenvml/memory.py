# mypy: disable-error-code="no-any-return"
"""The fake NVML library's memory area: framebuffer use (both struct versions) and BAR1.

nvmlMemory_t (v1) counts the driver's reserved memory as used; nvmlMemory_v2_t reports
it apart. A MIG device's memory is its slice's (exporter/sim/fakenvml/mig.py).
"""

from __future__ import annotations

from typing import Any

from exporter.sim.fakenvml import mig
from exporter.sim.fakenvml.abi import MIB, MIG_HANDLE_BASE, OK, Library, address, out, symbol


def framebuffer(lib: Library, g: int) -> tuple[int, int, int]:
    """(total, reserved, used) bytes of GPU `g`'s framebuffer now."""
    total = lib.model.memory_bytes
    reserved = lib.model.memory_reserved_bytes
    used = min(total - reserved, round(lib.t.gpu(g, "memory_used_ratio") * total))
    return total, reserved, used


@symbol("nvmlDeviceGetMemoryInfo_v2", mig_monitor=True)
def memory_info_v2(lib: Library, h: Any, ref: Any) -> int:
    if address(h) >= MIG_HANDLE_BASE:
        return mig.memory_info(lib, h, ref)
    total, reserved, used = framebuffer(lib, lib.gpu_of(h))
    info = out(ref)
    info.total, info.reserved, info.used = total, reserved, used
    info.free = total - reserved - used
    return OK


@symbol("nvmlDeviceGetMemoryInfo", mig_monitor=True)
def memory_info(lib: Library, h: Any, ref: Any) -> int:
    if address(h) >= MIG_HANDLE_BASE:
        return mig.memory_info(lib, h, ref)
    total, reserved, used = framebuffer(lib, lib.gpu_of(h))
    info = out(ref)
    info.total, info.used, info.free = total, used + reserved, total - used - reserved
    return OK


@symbol("nvmlDeviceGetBAR1MemoryInfo")
def bar1_memory_info(lib: Library, h: Any, ref: Any) -> int:
    info = out(ref)
    info.bar1Total = 128 * 1024 * MIB
    info.bar1Used = 40 * MIB
    info.bar1Free = info.bar1Total - info.bar1Used
    return OK
