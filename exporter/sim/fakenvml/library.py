# mypy: disable-error-code="no-any-return"
"""The fake NVML library: one object that answers pynvml's C calls from a scenario timeline.

`FakeLibrary` is made of the symbols its area modules register (`AREAS`). Each one is
an attribute named after the C function, as dlsym would find it; the instance holds it
wrapped once, so that every call is counted, its CPU time is kept, and the scenario's
faults (hangs, lost GPUs, errors) and the part's NotSupported functions apply before
the area answers. A symbol the driver branch does not export is hidden from lookup.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

import pynvml as N

from exporter.sim.fakenvml import (
    abi,
    clocks,
    device,
    ecc,
    events,
    gpm,
    memory,
    mig,
    nvlink,
    pcie,
    power,
    processes,
    utilization,
)
from exporter.sim.fakenvml.abi import (
    ERROR_CODES,
    MIG_HANDLE_BASE,
    NOT_SUPPORTED,
    OK,
    Symbol,
    address,
    gpu_at,
    matches,
    noise,
    out,
    val,
)
from exporter.sim.scenario import Timeline

# What the library is made of: every area's registrations, one module per NVML area.
AREAS = (device, utilization, memory, clocks, power, pcie, nvlink, ecc, gpm, processes, events, mig)
S = TypeVar("S")


class FakeLibrary:
    """Answers pynvml's C calls from a scenario timeline."""

    def __new__(cls, timeline: Timeline) -> FakeLibrary:
        # pynvml looks symbols up with getattr(nvmlLib, name): a symbol this driver branch
        # does not export must raise AttributeError, which it turns into FunctionNotFound.
        # A subclass per branch hides them, so no other attribute lookup pays for it.
        missing = timeline.scenario.profile.driver.missing
        return object.__new__(hiding(cls, missing) if missing else cls)

    def __init__(self, timeline: Timeline) -> None:
        self.t = timeline
        self.scn = timeline.scenario
        self.model = self.scn.gpu_model
        self.profile = self.scn.profile
        self.sysfs = device.write_sysfs(self.scn)
        self.uuids = device.gpu_uuids(self.scn)
        self.calls = 0
        self.inited_at = -1.0  # scenario time of the last successful nvmlInit
        self._lock = threading.Lock()
        self._states: dict[type, object] = {}
        self._cpu: dict[int, float] = {}  # thread -> CPU seconds spent answering calls
        for name, sym in abi.SYMBOLS.items():
            if name not in self.profile.driver.missing:
                setattr(self, name, self._entry(name, sym, getattr(self, name)))

    def close(self) -> None:
        shutil.rmtree(self.sysfs, ignore_errors=True)

    # ---- what areas use (abi.Library) ------------------------------------------------------

    def gpu_of(self, handle: Any) -> int:
        return gpu_at(address(handle), self.scn.gpu_count)

    def v(self, gpu: int, key: str) -> float:
        now = self.t.now()
        return self.t.gpu(gpu, key, now) * (1.0 if self.scn.steady else noise(now, gpu, key))

    def state(self, kind: type[S]) -> S:
        found = self._states.get(kind)
        if found is None:
            with self._lock:
                found = self._states.setdefault(kind, kind())
        return cast(S, found)

    # ---- what tests and benchmarks read ------------------------------------------------------

    @property
    def cpu_seconds(self) -> float:
        """CPU spent answering calls: libnvidia-ml's C work, done here in Python."""
        return sum(self._cpu.values())

    @property
    def gpm_samples_allocated(self) -> int:
        """GPM sample buffers allocated and not yet freed."""
        return gpm.allocated(self)

    # ---- field values: every area's fields ---------------------------------------------------

    def _field(self, g: int, fid: int, scope: int) -> float | None:
        answer = abi.FIELDS.get(fid)
        return None if answer is None else answer(self, g, fid, scope)

    # ---- the entry points -----------------------------------------------------------------

    def _entry(self, name: str, sym: Symbol, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` as pynvml calls it: counted, timed, faulted and refused as the scenario says."""
        if not sym.status:
            return lambda *args: fn(*args)  # a plain function: pynvml sets its restype
        takes_handle = sym.first == "handle"
        by_index = sym.first == "index"
        faulty = any(f.kind in ("hang", "lost", "error", "reload") for f in self.scn.faults)
        reloads = [f for f in self.scn.faults if f.kind == "reload"]
        init, shutdown = name == "nvmlInitWithFlags", name == "nvmlShutdown"
        refused = any(matches(f, name) for f in self.profile.part.not_supported)
        no_monitor = sym.mig_monitor and not self.profile.mig_monitor
        count = self.scn.gpu_count

        def call(*args: Any) -> Any:
            started = time.thread_time()
            try:
                return answer(*args)
            finally:  # per thread: no lock, no lost update
                me = threading.get_ident()
                self._cpu[me] = self._cpu.get(me, 0.0) + time.thread_time() - started

        def answer(*args: Any) -> Any:
            self.calls += 1
            addr = address(args[0]) if takes_handle and args else None
            gpu = val(args[0]) if by_index else (None if addr is None else gpu_at(addr, count))
            if takes_handle and gpu == -1:
                return N.NVML_ERROR_INVALID_ARGUMENT  # not a handle this library handed out
            if faulty:
                now = self.t.now()
                for f in reloads:
                    # While the driver is away every call fails; once it is back, a session
                    # begun before is dead (Uninitialized) until nvmlInit is called again.
                    if f.active(now) and not shutdown:
                        return ERROR_CODES.get(f.error, ERROR_CODES["DriverNotLoaded"])
                    if f.until <= now and self.inited_at < f.until and not (init or shutdown):
                        return ERROR_CODES["Uninitialized"]
                for f in self.t.faults("hang", now):
                    if matches(f.function, name) and (f.gpu is None or f.gpu == gpu):
                        time.sleep(f.seconds)
                if gpu is not None and gpu >= 0:
                    for f in self.t.faults("lost", now):
                        if f.gpu is None or f.gpu == gpu:
                            return ERROR_CODES["GpuIsLost"]
                for f in self.t.faults("error", now):
                    if matches(f.function, name) and (f.gpu is None or f.gpu == gpu):
                        return ERROR_CODES.get(f.error, ERROR_CODES["Unknown"])
            if refused:
                return NOT_SUPPORTED
            # A container given MIG devices without NVIDIA_MIG_MONITOR_DEVICES may not read
            # the whole MIG parent (the symbol takes a handle: gpu is its GPU).
            parent = addr is not None and addr < MIG_HANDLE_BASE
            if no_monitor and parent and gpu is not None and mig.mig_on(self.scn, gpu):
                return N.NVML_ERROR_NO_PERMISSION
            status = fn(*args)
            if init and status == OK:  # a new session: no GPU is registered for events yet
                self.inited_at = self.t.now()
                self.state(events.Registered).gpus.clear()
            return status

        return call


@abi.symbol("nvmlDeviceGetFieldValues")
def _field_values(lib: FakeLibrary, h: Any, count: Any, ref: Any) -> int:
    g = lib.gpu_of(h)
    values = out(ref)
    for i in range(val(count)):
        fv = values[i]
        # nvml.h nvmlFieldValue_t.nvmlReturn: each field fails on its own and the call
        # still succeeds. An id newer than the driver is refused like an unknown one.
        if fv.fieldId in lib.profile.driver.unknown_fields:
            fv.nvmlReturn = N.NVML_ERROR_INVALID_ARGUMENT
            continue
        value = (
            None
            if fv.fieldId in lib.profile.part.fields_not_supported
            else lib._field(g, fv.fieldId, fv.scopeId)
        )
        if value is None:
            fv.nvmlReturn = NOT_SUPPORTED
            continue
        fv.nvmlReturn = OK
        fv.valueType = N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        fv.value.ullVal = int(value)
        fv.timestamp = int(time.time() * 1e6)
    return OK


# The C symbols as dlsym finds them: class attributes, so that a driver branch can hide one.
for _name, _sym in abi.SYMBOLS.items():
    setattr(FakeLibrary, _name, _sym.fn)


class _Absent:
    """A function the driver branch does not export: looking it up fails as dlsym does."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        raise AttributeError(self.name)


_HIDING: dict[tuple[type, frozenset[str]], type] = {}


def hiding(cls: type, missing: frozenset[str]) -> type:
    """`cls` with the symbols `missing` hidden: one class per driver branch, made once."""
    key = (cls, missing)
    if key not in _HIDING:
        _HIDING[key] = type(cls.__name__, (cls,), {name: _Absent() for name in missing})
    return _HIDING[key]


def installed() -> FakeLibrary:
    """The fake library pynvml is using now."""
    assert isinstance(N.nvmlLib, FakeLibrary), "the fake NVML library is not installed"
    return N.nvmlLib


def install(timeline: Timeline) -> FakeLibrary:
    """Make pynvml load the fake library instead of libnvidia-ml."""
    lib = FakeLibrary(timeline)
    with N.libLoadLock:
        N.nvmlLib = lib
        N._nvmlGetFunctionPointer_cache.clear()
    return lib


def uninstall() -> None:
    with N.libLoadLock:
        if isinstance(N.nvmlLib, FakeLibrary):
            N.nvmlLib.close()
        N.nvmlLib = None
        N._nvmlGetFunctionPointer_cache.clear()
