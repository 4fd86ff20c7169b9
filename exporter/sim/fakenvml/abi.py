# mypy: disable-error-code="no-any-return"
"""How the fake NVML library answers in C terms, and the table its areas register in.

pynvml passes ctypes objects by reference and reads what the library wrote into them;
`out`, `val` and `set_pointer` write and read there. Handles are made-up addresses
nothing dereferences: `HANDLE_BASE + gpu`, or `mig_handle(gpu, slot)` for a MIG device.
Each area module registers the C functions it answers with `@symbol` and the field ids
it answers inside nvmlDeviceGetFieldValues with `@field`; an area sees the library only
through `Library`.
"""

from __future__ import annotations

import ctypes
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

import pynvml as N

from exporter.sim.drivers import DriverProfile
from exporter.sim.gpu_models import GpuModel
from exporter.sim.scenario import Scenario, Timeline

OK = N.NVML_SUCCESS
NOT_SUPPORTED = N.NVML_ERROR_NOT_SUPPORTED
ERROR_CODES = {
    cls.__name__.removeprefix("NVMLError_"): code for code, cls in N.NVMLError._valClassMapping.items()
}
MIB = 1024 * 1024

# ---- handles ---------------------------------------------------------------------------

HANDLE_BASE = 0x10_0000  # handles are opaque addresses nothing dereferences
MIG_HANDLE_BASE = 0x20_0000
MIG_SLOTS = 16  # MIG device handles per GPU
EVENT_SET = 0x30_0000


def address(handle: Any) -> int:
    # The pointer's own bytes: a fifth of what ctypes.cast costs, on every call answered.
    return int.from_bytes(bytes(handle), sys.byteorder)


def gpu_at(addr: int, gpu_count: int) -> int:
    """The GPU a handle of this library points at (a MIG device's: its parent), or -1."""
    if HANDLE_BASE <= addr < HANDLE_BASE + gpu_count:
        return addr - HANDLE_BASE
    if MIG_HANDLE_BASE <= addr < MIG_HANDLE_BASE + 0x10000:
        return (addr - MIG_HANDLE_BASE) // MIG_SLOTS
    return -1


def mig_handle(gpu: int, slot: int) -> int:
    return MIG_HANDLE_BASE + gpu * MIG_SLOTS + slot


def mig_slot(addr: int) -> tuple[int, int]:
    """(parent GPU, slot) of a MIG device handle."""
    return divmod(addr - MIG_HANDLE_BASE, MIG_SLOTS)


# ---- out-parameters ----------------------------------------------------------------------


def val(x: Any) -> Any:
    """A by-value argument: a ctypes number or a plain one."""
    return x.value if hasattr(x, "value") else x


def out(ref: Any) -> Any:
    """The ctypes object behind a byref() argument."""
    return ref._obj


def set_pointer(ref: Any, addr: int) -> None:
    ctypes.cast(ctypes.pointer(out(ref)), ctypes.POINTER(ctypes.c_void_p)).contents.value = addr


def matches(function: str | None, symbol: str) -> bool:
    """A fault or quirk on `nvmlDeviceGetMemoryInfo` also hits its `_v2` symbol, and one on
    `nvmlDeviceGetTemperature` its struct-versioned successor `nvmlDeviceGetTemperatureV`."""
    return function is not None and (
        symbol in (function, function + "V") or symbol.startswith(function + "_v")
    )


def noise(t: float, gpu: int, key: str) -> float:
    """A small deterministic wobble so charts look alive without hiding the story."""
    return 1.0 + 0.015 * math.sin(t * 0.7 + gpu * 1.3 + len(key))


# ---- what an area sees of the library ------------------------------------------------------

S = TypeVar("S")


class Library(Protocol):
    """The fake library as its areas use it (exporter/sim/fakenvml/library.py)."""

    t: Timeline
    scn: Scenario
    model: GpuModel
    profile: DriverProfile
    uuids: list[str]

    def gpu_of(self, handle: Any) -> int:
        """The GPU index of a handle (a MIG device's: its parent's)."""

    def v(self, gpu: int, key: str) -> float:
        """A timeline value now, with the wobble unless the scenario is steady."""

    def state(self, kind: type[S]) -> S:
        """This library's one `kind()`: an area's mutable state, made on first use."""


# ---- the symbol table ------------------------------------------------------------------------

First = Literal["handle", "index", "none"]
FieldAnswer = Callable[[Library, int, int, int], float | None]  # (library, gpu, field id, scope id)


@dataclass(frozen=True)
class Symbol:
    fn: Callable[..., Any]  # (library, *the C arguments) -> an NVML status code
    first: First  # what the first C argument is: a device handle, a GPU index, or neither
    status: bool = True  # False: returns something else (nvmlErrorString), is never faulted
    mig_monitor: bool = False  # a whole-GPU read a MIG parent refuses without the monitor capability


SYMBOLS: dict[str, Symbol] = {}
FIELDS: dict[int, FieldAnswer] = {}


def symbol(
    *names: str, first: First | None = None, status: bool = True, mig_monitor: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the C symbol(s) `names`: pynvml finds it there,
    and calls it with the library and the ctypes arguments of the C signature. `first`
    defaults to a handle for nvmlDevice* functions: faults of that GPU apply to the call."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            if name in SYMBOLS:
                raise ValueError(f"{name} is registered twice ({SYMBOLS[name].fn.__module__})")
            what = first or ("handle" if name.startswith("nvmlDevice") else "none")
            SYMBOLS[name] = Symbol(fn, what, status, mig_monitor)
        return fn

    return register


def field(*ids: int | Iterable[int]) -> Callable[[FieldAnswer], FieldAnswer]:
    """Register the decorated function as the answer to field ids `ids` (numbers, or
    tuples of them) in nvmlDeviceGetFieldValues: it gets (library, gpu, field id, scope
    id) and returns the value, or None where this GPU does not support the field."""

    def register(fn: FieldAnswer) -> FieldAnswer:
        for fid in (i for group in ids for i in ((group,) if isinstance(group, int) else group)):
            if fid in FIELDS:
                raise ValueError(f"field id {fid} is registered twice ({FIELDS[fid].__module__})")
            FIELDS[fid] = fn
        return fn

    return register
