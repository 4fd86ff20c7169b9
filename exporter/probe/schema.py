"""The probe file: one JSON object per serving process, versioned.

The probe (inside vLLM) writes it, the exporter reads it; both sides use this module so
the format has one definition. A reader accepts exactly ``SCHEMA_VERSION``; unknown keys
are ignored so that a newer probe can add fields without a version bump, while a change
in the meaning or type of a field needs a new version.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

SCHEMA_VERSION = 1
FILE_PREFIX = "probe-"
FILE_SUFFIX = ".json"


class ProbeState:
    """Values of ``ProbeReport.state``."""

    WAITING_FOR_TORCH = "waiting_for_torch"  # torch not (yet) imported in this process
    NO_CUDA = "no_cuda"  # torch built without CUDA/ROCm: heartbeat only
    CUDA_NOT_INITIALIZED = "cuda_not_initialized"  # no CUDA context here (yet)
    SAMPLING = "sampling"  # allocator fields below are real readings
    FAILED = "failed"  # the probe raised, logged once and stopped

    ALL = frozenset({WAITING_FOR_TORCH, NO_CUDA, CUDA_NOT_INITIALIZED, SAMPLING, FAILED})


class ProbeFormatError(ValueError):
    """A probe file that can not be used; ``reason`` is a reader rejection reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class ProbeReport:
    """What one process' probe last saw. ``None``: not known in this state."""

    timestamp: float  # unix seconds when the probe wrote the file
    pid: int  # in the probe's pid namespace
    state: str  # a ProbeState value
    cuda_available: bool  # a CUDA context exists here and the allocator fields are real
    interval_seconds: float  # how often this probe writes
    process_name: str = ""  # multiprocessing name: "MainProcess", "EngineCore_DP0", ...
    pid_namespace: str | None = None  # "pid:[4026531836]"; liveness checks need the same
    hostname: str | None = None  # the pod name under Kubernetes
    rank: int | None = None  # torch.distributed rank, else RANK / LOCAL_RANK
    device_index: int | None = None  # CUDA device index inside the process
    uuid: str | None = None  # "GPU-…", comparable with NVML's UUID
    engine_port: int | None = None  # the engine's HTTP port when known
    reserved_bytes: int | None = None  # memory_stats reserved_bytes.all.current
    allocated_bytes: int | None = None  # allocated_bytes.all.current
    requested_bytes: int | None = None  # requested_bytes.all.current
    inactive_split_bytes: int | None = None  # inactive_split_bytes.all.current
    alloc_retries_total: int | None = None  # num_alloc_retries
    ooms_total: int | None = None  # num_ooms
    device_malloc_total: int | None = None  # num_device_alloc
    device_free_total: int | None = None  # num_device_free
    large_free_blocks: int | None = None  # inactive blocks in large segments
    large_free_bytes: int | None = None  # their total size
    largest_free_block_bytes: int | None = None  # the largest of them
    fragmentation_ratio: float | None = None  # 1 - largest / total free
    fragmentation_sq_ratio: float | None = None  # 1 - sum(f^2) / sum(f)^2
    snapshot_duration_seconds: float | None = None  # time memory_snapshot() held the lock
    error: str | None = None  # why the probe stopped (state "failed")

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        data.update(asdict(self))
        return data

    def to_json(self) -> bytes:
        """Compact UTF-8 JSON with ``schema_version`` first."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def from_dict(cls, data: object) -> ProbeReport:
        """Validate a decoded object; raises ProbeFormatError (``malformed``/``schema_version``)."""
        if not isinstance(data, dict):
            raise ProbeFormatError("malformed", "not a JSON object")
        version = data.get("schema_version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise ProbeFormatError("malformed", "schema_version missing or not an integer")
        if version != SCHEMA_VERSION:
            raise ProbeFormatError("schema_version", f"version {version}, want {SCHEMA_VERSION}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            kind, optional, required = _FIELD_KINDS[f.name]
            if f.name not in data:
                if required:
                    raise ProbeFormatError("malformed", f"missing field {f.name}")
                continue
            values[f.name] = _check(f.name, data[f.name], kind, optional)
        if values["state"] not in ProbeState.ALL:
            raise ProbeFormatError("malformed", f"unknown state {values['state']!r}")
        if values["pid"] <= 0:
            raise ProbeFormatError("malformed", "pid must be positive")
        return cls(**values)

    @classmethod
    def from_json(cls, raw: bytes | str) -> ProbeReport:
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise ProbeFormatError("malformed", f"not JSON ({exc.__class__.__name__})") from exc
        return cls.from_dict(data)


def file_name(pid: int, pid_namespace: str | None = None) -> str:
    """The file a probe writes: ``probe-<pid namespace inode>-<pid>.json``.

    Pods sharing one probe directory reuse the same pids (often 1 for the API server);
    the namespace inode keeps their files apart. ``0`` when the namespace is unknown.
    """
    digits = "".join(ch for ch in pid_namespace or "" if ch.isdigit()) or "0"
    return f"{FILE_PREFIX}{digits}-{pid}{FILE_SUFFIX}"


def _check(name: str, value: object, kind: str, optional: bool) -> object:
    if value is None:
        if optional:
            return None
        raise ProbeFormatError("malformed", f"{name} is null")
    if kind == "bool":
        if isinstance(value, bool):
            return value
    elif kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif isinstance(value, str):
        return value
    raise ProbeFormatError("malformed", f"{name} is not {kind}")


def _field_kinds() -> dict[str, tuple[str, bool, bool]]:
    """name -> (base type, accepts None, required) from the dataclass annotations."""
    kinds: dict[str, tuple[str, bool, bool]] = {}
    for f in fields(ProbeReport):
        annotation = str(f.type).replace(" ", "")
        optional = annotation.endswith("|None")
        base = annotation.removesuffix("|None")
        if base not in ("bool", "int", "float", "str"):
            raise TypeError(f"ProbeReport.{f.name}: unsupported annotation {f.type}")
        required = f.default is MISSING and f.default_factory is MISSING
        kinds[f.name] = (base, optional, required)
    return kinds


_FIELD_KINDS = _field_kinds()
