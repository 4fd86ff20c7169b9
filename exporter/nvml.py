"""The one module that touches pynvml: calls, error mapping, device handles.

Everything else calls `Nvml.query(...)` and reads constants from `nvml.const`.
"NOT_SUPPORTED" and "FUNCTION_NOT_FOUND" (a driver older than the binding) both mean
the value is absent and come back as `None`; every other NVML error is raised as
`NvmlError` carrying the error's short name (GpuIsLost, Timeout, ...).

The oldest binding this supports (nvidia-ml-py 12.535) lacks names that newer drivers
answer to, so field ids are numbers here (each names its nvml.h constant) and functions
a binding may not have are looked up with `function()`, which then answers
FunctionNotFound like a driver without the symbol would.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

import pynvml

const = pynvml
log = logging.getLogger(__name__)

_ABSENT = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
# Errors that are about the GPU, not about one function: the GPU is down and its handle
# must be fetched again. Any other error (NoPermission, Unknown, Timeout, ...) only takes
# away that call's values.
DEVICE_GONE = frozenset(
    {
        "GpuIsLost",
        "Uninitialized",
        "ResetRequired",
        "DriverNotLoaded",
        "LibRmVersionMismatch",
    }
)
# Errors that mean the driver went away or came back (reloaded, upgraded, unloaded): no
# handle of this session is any use again; the session is shut down and initialised anew
# (`Nvml.recover`), with a backoff while the driver stays away.
RELOADED = frozenset({"Uninitialized", "DriverNotLoaded", "LibRmVersionMismatch"})
RESTART_BACKOFF_S = (1.0, 60.0)  # first wait after a failed nvmlInit, and the longest
# nvml.h answers InvalidArgument both for a stale device handle and for an argument the
# part lacks (a link or an NVLink error counter it does not have): it means the GPU is
# gone only when the handle no longer resolves (`Nvml.resolves`).
INVALID_ARGUMENT = "InvalidArgument"
# Errors of a call the GPU did not answer: a read in which every call ends so means the
# GPU is not answering (gpu.py); NoPermission and the like are answers.
UNANSWERED = frozenset({"Unknown", "Timeout"})

# Field ids (nvml.h NVML_FI_DEV_*), by number: see the module docstring.
# The counters nvmlDeviceGetViolationStatus answers for NVML_PERF_POLICY_POWER and _THERMAL
# (deprecated in nvml.h 13.0, which maps them to ..._SW_POWER_CAP and ..._SW_THERM_SLOWDOWN),
# by ids that never moved: ns.
FI_PERF_POLICY_POWER = 74  # NVML_FI_DEV_PERF_POLICY_POWER (= ..._CLOCKS_EVENT_REASON_SW_POWER_CAP)
FI_PERF_POLICY_THERMAL = 75  # NVML_FI_DEV_PERF_POLICY_THERMAL
# NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN and _HW_POWER_BRAKE_SLOWDOWN (ns) moved:
# nvml.h 12.9/13.0 and nvidia-ml-py 12.575.51/13.580.65 have them at 252/253 (269-271 are
# power-smoothing settings there); nvml.h 13.1+ and nvidia-ml-py 13.580.82+ at 270/271
# (251-268 are power smoothing); nvml.h 12.8 and older have neither.
FI_HW_SLOWDOWN_R575 = {"hw_thermal": 252, "hw_power_brake": 253}
FI_HW_SLOWDOWN_R580_82 = {"hw_thermal": 270, "hw_power_brake": 271}
FI_MEMORY_TEMP = 82  # NVML_FI_DEV_MEMORY_TEMP, degrees C
FI_NVLINK_LINK_COUNT = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
FI_PCIE_REPLAY_COUNTER = 94  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
FI_NVLINK_THROUGHPUT_DATA_TX = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, KiB, scopeId = link
FI_NVLINK_THROUGHPUT_DATA_RX = 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, KiB, scopeId = link
# nvml.h on the throughput fields: a scopeId of UINT_MAX answers the sum over all links.
SCOPE_ALL_LINKS = 0xFFFFFFFF
FI_NVLINK_ERROR_DL_REPLAY = 161  # NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, scopeId = link
FI_NVLINK_ERROR_DL_RECOVERY = 162  # NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, scopeId = link
FI_NVLINK_ERROR_DL_CRC = 163  # NVML_FI_DEV_NVLINK_ERROR_DL_CRC (flit CRC), scopeId = link
FI_NVLINK_GET_STATE = 165  # NVML_FI_DEV_NVLINK_GET_STATE, scopeId = link
# What field 165 (and nvmlDeviceGetNvLinkState) answers: NVML_NVLINK_STATE_* of nvml.h,
# SLEEP first defined in CUDA 12.8's header. A sleeping link is neither down nor active.
NVLINK_STATE_INACTIVE, NVLINK_STATE_ACTIVE, NVLINK_STATE_SLEEP = 0, 1, 2
FI_PCIE_COUNT_TX_BYTES = 197  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES
FI_PCIE_COUNT_RX_BYTES = 198  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES
# Data CRC has no link-scoped id: NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0..L5 are 39..44
# and _L6..L11 are 102..107, one id per link, none past link 11.
FI_NVLINK_CRC_DATA_ERROR_COUNT = (39, 40, 41, 42, 43, 44, 102, 103, 104, 105, 106, 107)


def hw_slowdown_fields(driver_version: str) -> dict[str, int] | None:
    """The field ids of the HW thermal and HW power brake durations on this driver: {} on
    drivers before R575 (none), None where its numbering is not known (580.66 to 580.81,
    which no header or binding release covers): then they are not read at all."""
    m = re.match(r"(\d+)\.(\d+)", driver_version)
    if m is None:
        return None
    major, minor = int(m.group(1)), int(m.group(2))
    if major < 575:
        return {}
    if major < 580 or (major == 580 and minor <= 65):
        return dict(FI_HW_SLOWDOWN_R575)
    if major > 580 or minor >= 82:
        return dict(FI_HW_SLOWDOWN_R580_82)
    return None


# Raised by the binding's unversioned wrappers (nvmlDeviceGetComputeRunningProcesses) when
# the driver lacks the versioned symbol they call; not an NVMLError. Older bindings lack it.
_MISMATCH: tuple[type[Exception], ...] = tuple(
    c for c in (getattr(pynvml, "NVMLLibraryMismatchError", None),) if isinstance(c, type)
)


def function(name: str) -> Callable[..., Any]:
    """A binding function by name; one the installed binding lacks answers FunctionNotFound."""
    fn = getattr(pynvml, name, None)
    if callable(fn):
        return fn  # type: ignore[no-any-return]

    def missing(*args: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    missing.__name__ = name
    return missing


class _FieldValue(ctypes.Structure):
    """nvml.h nvmlFieldValue_t, laid out as the binding's c_nvmlFieldValue_t. The binding's
    class converts bytes on every attribute read and write, which made field values a
    fifth of a sampling pass; this plain structure reads the same memory."""

    _fields_ = [
        ("fieldId", ctypes.c_uint32),
        ("scopeId", ctypes.c_uint32),
        ("timestamp", ctypes.c_int64),
        ("latencyUsec", ctypes.c_int64),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", pynvml.c_nvmlValue_t),
    ]


def nvmlDeviceGetFieldValues(handle: Any, values: ctypes.Array[_FieldValue]) -> None:
    """The binding's call of the same name, on a plain array of field values."""
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    pynvml._nvmlCheckReturn(fn(handle, ctypes.c_int32(len(values)), ctypes.byref(values)))


class _ProcessInfoV2(ctypes.Structure):
    """nvml.h nvmlProcessInfo_v2_t, what nvmlDeviceGetComputeRunningProcesses_v2 writes (24 bytes)."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _ProcessInfoR535(ctypes.Structure):
    """The record early R535 drivers write from nvmlDeviceGetComputeRunningProcesses_v3: the
    nvmlProcessInfo_t of CUDA 12.2.0/12.2.1's nvml.h, with usedGpuCcProtectedMemory (32
    bytes; nvidia-ml-py 12.535.77 read 32 too). CUDA 12.2.2's header (driver 535.104) went
    back to the 24-byte nvmlProcessInfo_v2_t, as the binding from 12.535.108 reads, so _v3
    is read here only without a _v2 symbol, with the record size of the driver's release."""

    _fields_ = [*_ProcessInfoV2._fields_, ("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]


class _ProcessUtilizationSample(ctypes.Structure):
    """nvml.h nvmlProcessUtilizationSample_t, what nvmlDeviceGetProcessUtilization writes."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),  # CPU time, microseconds
        ("smUtil", ctypes.c_uint),  # percent
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


class _ProcessUtilizationInfoV1(ctypes.Structure):
    """nvml.h nvmlProcessUtilizationInfo_v1_t (R550 and later): the same samples, timestamp first."""

    _fields_ = [
        ("timeStamp", ctypes.c_ulonglong),
        ("pid", ctypes.c_uint),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
        ("jpgUtil", ctypes.c_uint),
        ("ofaUtil", ctypes.c_uint),
    ]


class _ProcessesUtilizationInfoV1(ctypes.Structure):
    """nvml.h nvmlProcessesUtilizationInfo_v1_t, the argument of nvmlDeviceGetProcessesUtilizationInfo."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("processSamplesCount", ctypes.c_uint),
        ("lastSeenTimeStamp", ctypes.c_ulonglong),
        ("procUtilArray", ctypes.POINTER(_ProcessUtilizationInfoV1)),
    ]


# NVML_STRUCT_VERSION(ProcessesUtilizationInfo, 1): the structure's size | version << 24
PROCESSES_UTILIZATION_INFO_V1 = ctypes.sizeof(_ProcessesUtilizationInfoV1) | 1 << 24
# (pid, timestamp in microseconds, SM percent, memory-controller percent)
ProcessSample = tuple[int, int, int, int]
MPS_SERVER = "nvidia-cuda-mps-server"  # the MPS control daemon's server: it runs the clients' work

_NOT_AVAILABLE = 0xFFFF_FFFF_FFFF_FFFF  # NVML_VALUE_NOT_AVAILABLE for unsigned long long


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
        # The session: `generation` counts the sessions since start, `restarts` the ones
        # rebuilt after the driver went away; `lost` names the error that ended the
        # current one until it is rebuilt.
        self.generation = 0
        self.restarts = 0
        self.lost: str | None = None
        self._retry_at = 0.0
        self._backoff = RESTART_BACKOFF_S[0]
        self._waits = 0  # blocking calls in flight (the XID thread's event wait)
        self._before_restart: list[Callable[[], None]] = []

    # ---- the session across driver reloads ---------------------------------------------------

    def session_lost(self, name: str) -> None:
        """A call answered a RELOADED error: the session must be rebuilt before the next read."""
        with self._lock:
            if self.lost is None:
                self.lost = name
                self._retry_at = 0.0
                log.warning("NVML answered %s: the driver went away; the session will be rebuilt", name)

    def before_restart(self, release: Callable[[], None]) -> None:
        """Call `release` before the session is shut down (GPM sample buffers are freed there)."""
        self._before_restart.append(release)

    def recover(self, now: float) -> bool:
        """True when the session is usable. After `session_lost`, shut NVML down and
        initialise it again, at most once per backoff step (1 s doubling to 60 s) while the
        driver stays away, and never while a blocking call of the old session is in flight."""
        with self._lock:
            if self.lost is None:
                return True
            if self._waits or now < self._retry_at:
                return False
            self._retry_at = now + self._backoff  # the attempt below may fail
        for release in self._before_restart:
            with contextlib.suppress(Exception):
                release()
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
        try:
            pynvml.nvmlInit()
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as err:
            with self._lock:
                self._backoff = min(self._backoff * 2, RESTART_BACKOFF_S[1])
            log.warning(
                "NVML init after %s failed (%s); next try in %g s", self.lost, error_name(err), self._backoff
            )
            return False
        with self._lock:
            self._handles.clear()
            self._variant.clear()
            self.count = count
            self.generation += 1
            self.restarts += 1
            log.warning("NVML session rebuilt after %s: %d GPU(s)", self.lost, count)
            self.lost = None
            self._backoff = RESTART_BACKOFF_S[0]
        return True

    def blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`query` for a call that may block (an event wait): no restart runs meanwhile, and
        none starts on a session already lost."""
        with self._lock:
            if self.lost is not None:
                raise NvmlError(self.lost, getattr(fn, "__name__", "call"))
            self._waits += 1
        try:
            return self.query(fn, *args)
        finally:
            with self._lock:
                self._waits -= 1

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

    def resolves(self, index: int, handle: Any) -> bool:
        """Whether NVML still hands out `handle` for this index: False for a stale handle
        (the GPU was reset or fell off the bus), or when no handle can be had at all."""
        try:
            again = self.query(pynvml.nvmlDeviceGetHandleByIndex, index)
        except NvmlError:
            return False
        address = ctypes.cast(handle, ctypes.c_void_p).value
        return again is not None and ctypes.cast(again, ctypes.c_void_p).value == address

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
        except _MISMATCH:
            self._log_missing(fn.__name__)
            return None

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
        return {key: _field_value(v) for key, v in self._fields(handle, ids).items()}

    def field_types(self, handle: Any, ids: list[tuple[int, int]]) -> dict[tuple[int, int], int]:
        """The NVML_VALUE_TYPE_* each field is answered in: the width a counter wraps at."""
        return {key: int(v.valueType) for key, v in self._fields(handle, ids).items()}

    def _fields(self, handle: Any, ids: list[tuple[int, int]]) -> dict[tuple[int, int], _FieldValue]:
        values = (_FieldValue * len(ids))()
        for v, (fid, scope) in zip(values, ids, strict=True):
            v.fieldId, v.scopeId = fid, scope
        if not self.supported(nvmlDeviceGetFieldValues, handle, values):
            return {}
        ok = pynvml.NVML_SUCCESS
        return {key: v for key, v in zip(ids, values, strict=True) if v.nvmlReturn == ok}

    def compute_processes(self, handle: Any) -> list[tuple[int, int | None]] | None:
        """(pid, used bytes) of each compute process; None when the GPU cannot tell.

        The binding's nvmlDeviceGetComputeRunningProcesses calls the _v3 symbol with a
        record of its own release's size (32 bytes in 12.535.77, 24 after), which drivers
        of the other size garble (every process after the first) and drivers without _v3
        refuse with NVMLLibraryMismatchError. The _v2 symbol has kept one layout on every
        branch: it is called directly here.
        """
        return self._running("nvmlDeviceGetComputeRunningProcesses", handle)

    def mps_processes(self, handle: Any) -> list[tuple[int, int | None]] | None:
        """(pid, used bytes) of each client of the MPS server on this GPU (Volta and later):
        under MPS the clients' work runs through the server, and this list names them."""
        return self._running("nvmlDeviceGetMPSComputeRunningProcesses", handle)

    def _running(self, name: str, handle: Any) -> list[tuple[int, int | None]] | None:
        for symbol in (f"{name}_v2", f"{name}_v3"):
            try:
                fn = pynvml._nvmlGetFunctionPointer(symbol)
            except pynvml.NVMLError as err:
                if err.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    continue
                raise NvmlError(error_name(err), symbol) from err
            record = _ProcessInfoV2 if symbol.endswith("_v2") else self._v3_record()
            return self._processes(fn, symbol, handle, record)
        self._log_missing(name)
        return None

    def process_name(self, pid: int) -> str | None:
        """The name NVML gives a process (nvmlSystemGetProcessName); None when it cannot tell."""
        try:
            name = pynvml.nvmlSystemGetProcessName(pid)
        except pynvml.NVMLError:
            return None
        return decode(name) or None

    def process_utilization(self, handle: Any, since_us: int) -> list[ProcessSample] | None:
        """Per-process utilization samples taken after `since_us` (a cursor: the greatest
        timestamp seen so far, 0 for every sample the driver keeps); [] when there are none
        (NVML_ERROR_NOT_FOUND); None when the GPU cannot tell.

        nvmlDeviceGetProcessesUtilizationInfo (R550) is tried first, then
        nvmlDeviceGetProcessUtilization; the one this driver takes is remembered. Both are
        asked once for the count (NVML_ERROR_INSUFFICIENT_SIZE) and again with a buffer.
        """
        calls = (
            ("nvmlDeviceGetProcessesUtilizationInfo", self._utilization_info),
            ("nvmlDeviceGetProcessUtilization", self._utilization_samples),
        )
        for i in range(self._variant.get("process_utilization", 0), len(calls)):
            symbol, read = calls[i]
            try:
                fn = pynvml._nvmlGetFunctionPointer(symbol)
            except pynvml.NVMLError as err:
                if err.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise NvmlError(error_name(err), symbol) from err
                self._variant["process_utilization"] = i + 1
                continue
            ret, samples = read(fn, handle, since_us)
            if ret == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
                self._variant["process_utilization"] = i + 1
                continue
            self._variant["process_utilization"] = i
            if ret == pynvml.NVML_SUCCESS:
                return samples
            if ret == pynvml.NVML_ERROR_NOT_FOUND:
                return []
            if ret == pynvml.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise NvmlError(error_name(pynvml.NVMLError(ret)), symbol)
        self._log_missing("nvmlDeviceGetProcessUtilization")
        return None

    @staticmethod
    def _utilization_info(
        fn: Callable[..., int], handle: Any, since_us: int
    ) -> tuple[int, list[ProcessSample]]:
        info = _ProcessesUtilizationInfoV1(PROCESSES_UTILIZATION_INFO_V1, 0, since_us, None)
        ret = fn(handle, ctypes.byref(info))
        for _ in range(3):  # processes may start between the two calls
            if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
                break
            n = info.processSamplesCount * 2 + 5
            records = (_ProcessUtilizationInfoV1 * n)()
            info.processSamplesCount = n
            info.procUtilArray = ctypes.cast(records, ctypes.POINTER(_ProcessUtilizationInfoV1))
            ret = fn(handle, ctypes.byref(info))
            if ret == pynvml.NVML_SUCCESS:
                got = records[: info.processSamplesCount]
                return ret, [(int(r.pid), int(r.timeStamp), int(r.smUtil), int(r.memUtil)) for r in got]
        return ret, []

    @staticmethod
    def _utilization_samples(
        fn: Callable[..., int], handle: Any, since_us: int
    ) -> tuple[int, list[ProcessSample]]:
        count = ctypes.c_uint(0)
        since = ctypes.c_ulonglong(since_us)
        ret = fn(handle, None, ctypes.byref(count), since)
        for _ in range(3):
            if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
                break
            count.value = count.value * 2 + 5
            records = (_ProcessUtilizationSample * count.value)()
            ret = fn(handle, records, ctypes.byref(count), since)
            if ret == pynvml.NVML_SUCCESS:
                got = records[: count.value]
                return ret, [(int(r.pid), int(r.timeStamp), int(r.smUtil), int(r.memUtil)) for r in got]
        return ret, []

    def _v3_record(self) -> type[ctypes.Structure]:
        version = decode(self.query(pynvml.nvmlSystemGetDriverVersion) or "").split(".")
        early_r535 = (
            version[0] == "535" and len(version) > 1 and version[1].isdigit() and int(version[1]) < 104
        )
        return _ProcessInfoR535 if early_r535 else _ProcessInfoV2

    def _processes(
        self, fn: Callable[..., int], symbol: str, handle: Any, record: type[ctypes.Structure]
    ) -> list[tuple[int, int | None]] | None:
        count = ctypes.c_uint(0)
        ret = fn(handle, ctypes.byref(count), None)
        for _ in range(3):  # processes may start between the two calls
            if ret == pynvml.NVML_SUCCESS and count.value == 0:
                return []
            if ret not in (pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_INSUFFICIENT_SIZE):
                break
            count.value = count.value * 2 + 5
            records = (record * count.value)()
            ret = fn(handle, ctypes.byref(count), records)
            if ret == pynvml.NVML_SUCCESS:
                return [
                    (int(r.pid), None if r.usedGpuMemory == _NOT_AVAILABLE else int(r.usedGpuMemory))
                    for r in records[: count.value]
                ]
        if ret == pynvml.NVML_ERROR_NOT_SUPPORTED:
            return None
        raise NvmlError(error_name(pynvml.NVMLError(ret)), symbol)

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
