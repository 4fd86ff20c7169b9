"""The one module that touches pynvml: calls, error mapping, device handles.

Everything else calls `Nvml.query(...)` and reads constants from `nvml.const`.
"NOT_SUPPORTED" and "FUNCTION_NOT_FOUND" (a driver older than the binding) both mean
the value is absent and come back as `None`; every other NVML error is raised as
`NvmlError` carrying the error's short name (GpuIsLost, Timeout, ...).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections.abc import Callable
from typing import Any

import pynvml

const = pynvml
log = logging.getLogger(__name__)

_ABSENT = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
# Errors after which the GPU itself is not answering: its handle must be fetched again.
DEVICE_GONE = frozenset({"GpuIsLost", "Unknown", "Timeout", "InvalidArgument", "NotFound"})


class NvmlError(Exception):
    """An NVML call failed for a reason other than 'not supported'."""

    def __init__(self, name: str, function: str) -> None:
        super().__init__(f"{function}: {name}")
        self.name = name
        self.function = function


class NvmlUnavailable(RuntimeError):
    """No usable NVML library: no driver, or no GPU."""


def error_name(err: pynvml.NVMLError) -> str:
    """'NVMLError_GpuIsLost' -> 'GpuIsLost'; unknown codes keep their number."""
    cls = type(err).__name__
    if cls.startswith("NVMLError_"):
        return cls.removeprefix("NVMLError_")
    return f"Code{err.value}"


def decode(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Nvml:
    """An initialized NVML session with cached device handles."""

    def __init__(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise NvmlUnavailable(
                f"NVML is not available ({error_name(err)}): no NVIDIA driver is loaded on this host"
            ) from err
        self._handles: dict[int, Any] = {}
        self._index_by_address: dict[int, int] = {}
        self._lock = threading.Lock()
        self._missing_logged: set[str] = set()
        self._variant: dict[str, int] = {}
        self.count = self._device_count()

    def _device_count(self) -> int:
        count = self.query(pynvml.nvmlDeviceGetCount)
        return int(count or 0)

    def shutdown(self) -> None:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()

    def handle(self, index: int) -> Any:
        """The device handle, fetched again after the GPU was reported gone."""
        with self._lock:
            h = self._handles.get(index)
        if h is None:
            h = self.query(pynvml.nvmlDeviceGetHandleByIndex, index)
            if h is None:
                raise NvmlError("NotSupported", "nvmlDeviceGetHandleByIndex")
            with self._lock:
                self._handles[index] = h
                self._index_by_address[ctypes.cast(h, ctypes.c_void_p).value or 0] = index
        return h

    def index_of(self, handle: Any) -> int | None:
        """The GPU index of a handle that NVML handed back (event data).

        Remembered for every handle ever fetched, not only the current ones: an XID 79
        arrives just as its GPU falls off the bus and its handle is being dropped.
        """
        with self._lock:
            return self._index_by_address.get(ctypes.cast(handle, ctypes.c_void_p).value or 0)

    def forget(self, index: int) -> None:
        with self._lock:
            self._handles.pop(index, None)

    def query(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call a pynvml function; `None` when unsupported, NvmlError when broken."""
        try:
            return fn(*args)
        except pynvml.NVMLError as err:
            if err.value in _ABSENT:
                if err.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    self._log_missing(fn.__name__)
                return None
            raise NvmlError(error_name(err), fn.__name__) from err

    def supported(self, fn: Callable[..., Any], *args: Any) -> bool:
        """For calls that return nothing: True when done, False when not supported."""
        try:
            fn(*args)
        except pynvml.NVMLError as err:
            if err.value in _ABSENT:
                return False
            raise NvmlError(error_name(err), fn.__name__) from err
        return True

    def query_versioned(self, key: str, variants: list[Callable[[], Any]]) -> Any:
        """Try newer variants first; remember the first one this driver accepts.

        A variant answering FunctionNotFound or ArgumentVersionMismatch is skipped for
        good; NotSupported is an answer (the value is absent), not a reason to fall back.
        """
        start = self._variant.get(key, 0)
        for i in range(start, len(variants)):
            try:
                value = variants[i]()
            except pynvml.NVMLError as err:
                if err.value in (
                    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
                ):
                    self._variant[key] = i + 1
                    continue
                if err.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
                    return None
                raise NvmlError(error_name(err), key) from err
            self._variant[key] = i
            return value
        self._log_missing(key)
        return None

    def field_values(self, handle: Any, ids: list[tuple[int, int]]) -> dict[tuple[int, int], float]:
        """Several field values in one call; fields the GPU refuses are left out."""
        values = self.query(pynvml.nvmlDeviceGetFieldValues, handle, ids)
        out: dict[tuple[int, int], float] = {}
        for (fid, scope), v in zip(ids, values or (), strict=False):
            if v.nvmlReturn != pynvml.NVML_SUCCESS:
                continue
            out[(fid, scope)] = _field_value(v)
        return out

    def _log_missing(self, name: str) -> None:
        if name not in self._missing_logged:
            self._missing_logged.add(name)
            log.info("NVML function %s is not in this driver; its metrics stay absent", name)


def _field_value(v: Any) -> float:
    kind = v.valueType
    if kind == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return float(v.value.dVal)
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return float(v.value.uiVal)
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(v.value.ulVal)
    if kind == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(v.value.sllVal)
    if kind == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
        return float(v.value.siVal)
    return float(v.value.ullVal)
