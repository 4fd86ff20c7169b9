"""Read a probe directory: the valid reports, and every rejected file counted by reason.

The caller passes the clock (``now``), so a scan is a function of the directory's
contents and its arguments. Bad files never raise: each is counted under one reason.

| reason | file |
|---|---|
| ``malformed`` | not JSON, truncated, wrong types, not a regular file |
| ``too_large`` | more than ``max_bytes`` |
| ``schema_version`` | another ``schema_version`` |
| ``stale`` | ``timestamp`` older than ``max_age_s`` (or as far in the future) |
| ``dead_pid`` | its process is gone (only judged inside the same pid namespace) |
| ``duplicate`` | a second file for the same process (pid namespace, pid): newest wins |
| ``vanished`` | removed or replaced between listing and reading |
| ``too_many`` | beyond ``max_files`` in one scan |

Probes replace their file atomically (temp file + rename), so a reader never sees half a
write; temp files start with ``.`` and are not listed.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from exporter.probe.schema import FILE_SUFFIX, ProbeFormatError, ProbeReport

DEFAULT_MAX_BYTES = 64 * 1024
DEFAULT_MAX_FILES = 1024
REJECT_REASONS = (
    "malformed",
    "too_large",
    "schema_version",
    "stale",
    "dead_pid",
    "duplicate",
    "vanished",
    "too_many",
)

PidCheck = Callable[[ProbeReport], bool]


@dataclass(frozen=True)
class ProbeScan:
    """One pass over the probe directory."""

    reports: tuple[ProbeReport, ...] = ()  # valid and fresh, by (pid namespace, pid)
    rejected: Counter[str] = field(default_factory=Counter)  # reason -> files
    files_seen: int = 0  # candidate files listed (``*.json``, not hidden)
    directory_present: bool = False  # the directory exists and could be listed


@lru_cache(maxsize=1)
def own_pid_namespace() -> str | None:
    """This process' pid namespace (``pid:[4026531836]``), None where /proc lacks it."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def process_alive(report: ProbeReport) -> bool:
    """False only when the report's pid is provably gone.

    A pid can only be checked from inside the same pid namespace: an exporter pod sees
    other pods' processes under other numbers, or not at all. Reports from elsewhere
    count as alive and age out through ``stale`` instead.
    """
    own = own_pid_namespace()
    if own is None or report.pid_namespace != own:
        return True
    try:
        os.kill(report.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    return True


def _read_bounded(path: str, max_bytes: int) -> bytes | str:
    """The file's bytes, or a rejection reason."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return "vanished"
    except OSError as exc:
        return "malformed" if exc.errno in (errno.ELOOP, errno.EISDIR) else "vanished"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "malformed"
        if info.st_size > max_bytes:
            return "too_large"
        chunks: list[bytes] = []
        remaining = max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
    except OSError:
        return "vanished"
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        return "too_large"  # grew after fstat
    return data


def scan_probe_dir(
    path: str | os.PathLike[str],
    now: float,
    max_age_s: float,
    max_bytes: int = DEFAULT_MAX_BYTES,
    *,
    max_files: int = DEFAULT_MAX_FILES,
    pid_alive: PidCheck | None = process_alive,
) -> ProbeScan:
    """Valid, fresh reports of ``path`` and a count of rejected files by reason.

    ``now`` is unix seconds. ``pid_alive=None`` skips the liveness check.
    A missing directory is an empty scan with ``directory_present`` False.
    """
    rejected: Counter[str] = Counter()
    try:
        with os.scandir(path) as entries:
            names = sorted(
                entry.name
                for entry in entries
                if entry.name.endswith(FILE_SUFFIX) and not entry.name.startswith(".")
            )
    except OSError:
        return ProbeScan()

    if len(names) > max_files:
        rejected["too_many"] += len(names) - max_files
        names = names[:max_files]

    by_pid: dict[tuple[str | None, int], ProbeReport] = {}
    for name in names:
        raw = _read_bounded(os.path.join(path, name), max_bytes)
        if isinstance(raw, str):
            rejected[raw] += 1
            continue
        try:
            report = ProbeReport.from_json(raw)
        except ProbeFormatError as exc:
            rejected[exc.reason] += 1
            continue
        if abs(now - report.timestamp) > max_age_s:
            rejected["stale"] += 1
            continue
        if pid_alive is not None and not pid_alive(report):
            rejected["dead_pid"] += 1
            continue
        key = (report.pid_namespace, report.pid)
        previous = by_pid.get(key)
        if previous is not None:
            rejected["duplicate"] += 1
            if previous.timestamp >= report.timestamp:
                continue
        by_pid[key] = report

    reports = tuple(sorted(by_pid.values(), key=lambda r: (r.pid_namespace or "", r.pid)))
    return ProbeScan(reports=reports, rejected=rejected, files_seen=len(names), directory_present=True)
