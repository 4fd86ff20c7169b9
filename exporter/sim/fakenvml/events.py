# mypy: disable-error-code="no-any-return"
"""The fake NVML library's events area: one event set, and the scenario's XIDs delivered
through it, each once, as soon as its time has come."""

from __future__ import annotations

import ctypes
import time
from typing import Any

import pynvml as N

from exporter.sim.fakenvml import mig
from exporter.sim.fakenvml.abi import (
    EVENT_SET,
    HANDLE_BASE,
    OK,
    Library,
    mig_handle,
    out,
    set_pointer,
    symbol,
    val,
)


class Registered:
    """The GPUs registered for events, and the XIDs already delivered."""

    def __init__(self) -> None:
        self.gpus: set[int] = set()
        self.delivered: set[tuple[int, float]] = set()  # (gpu, scenario time)


@symbol("nvmlEventSetCreate")
def event_set_create(lib: Library, ref: Any) -> int:
    set_pointer(ref, EVENT_SET)
    return OK


@symbol("nvmlEventSetFree")
def event_set_free(lib: Library, s: Any) -> int:
    return OK


@symbol("nvmlDeviceRegisterEvents")
def register_events(lib: Library, h: Any, types: Any, s: Any) -> int:
    lib.state(Registered).gpus.add(lib.gpu_of(h))
    return OK


@symbol("nvmlEventSetWait_v2")
def event_set_wait(lib: Library, s: Any, ref: Any, timeout_ms: Any) -> int:
    seen = lib.state(Registered)
    deadline = time.monotonic() + val(timeout_ms) / 1000
    while True:
        # Each XID fires once, as soon as its time has come, however fast time runs.
        now = lib.t.now()
        to_come = [
            f
            for f in lib.scn.faults
            if f.kind == "xid" and (f.gpu or 0, f.at) not in seen.delivered and (f.gpu or 0) in seen.gpus
        ]
        for f in (f for f in to_come if f.at <= now):
            gpu = f.gpu or 0
            seen.delivered.add((gpu, f.at))
            data = out(ref)
            # An XID inside a GPU instance carries that MIG device's handle.
            address = mig_handle(gpu, 0) if mig.mig_on(lib.scn, gpu) else HANDLE_BASE + gpu
            data.device = ctypes.cast(ctypes.c_void_p(address), N.c_nvmlDevice_t)
            data.eventType = N.nvmlEventTypeXidCriticalError
            data.eventData = f.xid
            return OK
        if time.monotonic() >= deadline:
            return N.NVML_ERROR_TIMEOUT
        # As a driver blocks in its wait: poll only while an XID is still to come.
        left = max(0.0, deadline - time.monotonic())
        time.sleep(min(0.05, left) if to_come else left)
