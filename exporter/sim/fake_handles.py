# mypy: disable-error-code="no-any-return"
"""How the fake NVML library answers in C terms: status codes, opaque handles, out-parameters.

pynvml passes ctypes objects by reference and reads what the library wrote into them;
these helpers write there. Handles are made-up addresses nothing dereferences. A symbol
the driver branch lacks is hidden from pynvml's lookup as dlsym would hide it.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import pynvml as N

OK = N.NVML_SUCCESS
NOT_SUPPORTED = N.NVML_ERROR_NOT_SUPPORTED
ERROR_CODES = {
    cls.__name__.removeprefix("NVMLError_"): code for code, cls in N.NVMLError._valClassMapping.items()
}
HANDLE_BASE = 0x10_0000  # handles are opaque addresses nothing dereferences
MIG_HANDLE_BASE = 0x20_0000
EVENT_SET = 0x30_0000
MIB = 1024 * 1024


def _val(x: Any) -> Any:
    return x.value if hasattr(x, "value") else x


def _out(ref: Any) -> Any:
    """The ctypes object behind a byref() argument."""
    return ref._obj


def _set_pointer(ref: Any, address: int) -> None:
    ctypes.cast(ctypes.pointer(_out(ref)), ctypes.POINTER(ctypes.c_void_p)).contents.value = address


def _address(handle: Any) -> int:
    # The pointer's own bytes: a fifth of what ctypes.cast costs, on every call answered.
    return int.from_bytes(bytes(handle), sys.byteorder)


def _gpu_at(addr: int, gpu_count: int) -> int:
    """The GPU a handle of this library points at (a MIG device's: its parent), or -1."""
    if HANDLE_BASE <= addr < HANDLE_BASE + gpu_count:
        return addr - HANDLE_BASE
    if MIG_HANDLE_BASE <= addr < MIG_HANDLE_BASE + 0x10000:
        return (addr - MIG_HANDLE_BASE) // 16
    return -1


class _Absent:
    """A function the driver branch does not export: looking it up fails as dlsym does."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        raise AttributeError(self.name)


_HIDING: dict[tuple[type, frozenset[str]], type] = {}


def _without(cls: type, missing: frozenset[str]) -> type:
    """`cls` with `missing` hidden: one class per driver branch, made once."""
    key = (cls, missing)
    if key not in _HIDING:
        _HIDING[key] = type(cls.__name__, (cls,), {name: _Absent() for name in missing})
    return _HIDING[key]


def _matches(function: str | None, symbol: str) -> bool:
    """A fault on `nvmlDeviceGetMemoryInfo` also hits its `_v2` symbol."""
    return function is not None and (symbol == function or symbol.startswith(function + "_v"))
