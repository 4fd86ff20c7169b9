# mypy: disable-error-code="no-any-return"
"""How the fake NVML library answers in C terms: status codes, opaque handles, out-parameters.

pynvml passes ctypes objects by reference and reads what the library wrote into them;
these helpers write there. Handles are made-up addresses nothing dereferences.
"""

from __future__ import annotations

import ctypes
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
    return ctypes.cast(handle, ctypes.c_void_p).value or 0
