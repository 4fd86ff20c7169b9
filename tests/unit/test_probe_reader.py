"""The probe directory reader on good and bad files, and the file format itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from exporter.probe.plugin import write_report
from exporter.probe.reader import REJECT_REASONS, ProbeScan, own_pid_namespace, scan_probe_dir
from exporter.probe.schema import SCHEMA_VERSION, ProbeFormatError, ProbeReport, file_name

NOW = 1_800_000_000.0
MAX_AGE = 60.0


def report(pid: int = 4242, **changes: Any) -> ProbeReport:
    base = ProbeReport(
        timestamp=NOW - 5,
        pid=pid,
        state="sampling",
        cuda_available=True,
        interval_seconds=15.0,
        process_name="VllmWorker-0",
        pid_namespace="pid:[4026531836]",
        hostname="vllm-0",
        rank=0,
        device_index=0,
        uuid="GPU-0b7f1c2e-0000-0000-0000-000000000000",
        engine_port=8000,
        reserved_bytes=40 << 30,
        allocated_bytes=30 << 30,
        requested_bytes=29 << 30,
        inactive_split_bytes=1 << 30,
        alloc_retries_total=2,
        ooms_total=0,
        device_malloc_total=120,
        device_free_total=3,
        large_free_blocks=3,
        large_free_bytes=6 << 30,
        largest_free_block_bytes=4 << 30,
        fragmentation_ratio=1 / 3,
        fragmentation_sq_ratio=0.44,
        snapshot_duration_seconds=0.004,
    )
    return replace(base, **changes)


def put(directory: Path, name: str, content: bytes | str) -> Path:
    path = directory / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def put_report(directory: Path, r: ProbeReport) -> Path:
    return put(directory, file_name(r.pid, r.pid_namespace), r.to_json())


def scan(directory: Path, **kwargs: Any) -> ProbeScan:
    kwargs.setdefault("pid_alive", None)
    return scan_probe_dir(directory, NOW, MAX_AGE, **kwargs)


def test_report_round_trips_through_json() -> None:
    r = report()
    data = json.loads(r.to_json())
    assert data["schema_version"] == SCHEMA_VERSION
    assert next(iter(data)) == "schema_version"
    assert ProbeReport.from_json(r.to_json()) == r


def test_heartbeat_without_cuda_round_trips() -> None:
    r = ProbeReport(timestamp=NOW, pid=7, state="no_cuda", cuda_available=False, interval_seconds=15)
    back = ProbeReport.from_json(r.to_json())
    assert back == r
    assert back.reserved_bytes is None and back.fragmentation_ratio is None


def test_file_name_keeps_pods_with_equal_pids_apart() -> None:
    assert file_name(1, "pid:[4026532001]") == "probe-4026532001-1.json"
    assert file_name(1, "pid:[4026532002]") != file_name(1, "pid:[4026532001]")
    assert file_name(1, None) == "probe-0-1.json"


def test_directory_of_good_and_bad_files(tmp_path: Path) -> None:
    good = [report(pid=101), report(pid=102, state="no_cuda", cuda_available=False)]
    for r in good:
        put_report(tmp_path, r)
    whole = report(pid=103).to_json()
    put(tmp_path, "probe-0-103.json", whole[: len(whole) // 2])  # truncated
    put(tmp_path, "probe-0-104.json", b"\x00\xff garbage")  # not JSON
    put(tmp_path, "probe-0-105.json", "[1, 2, 3]")  # JSON, not an object
    put(tmp_path, "probe-0-106.json", b" " * (64 * 1024 + 1))  # too large
    other = report(pid=107).to_dict() | {"schema_version": SCHEMA_VERSION + 1}
    put(tmp_path, "probe-0-107.json", json.dumps(other))  # another schema version
    put_report(tmp_path, report(pid=108, timestamp=NOW - MAX_AGE - 1))  # stale
    put_report(tmp_path, report(pid=109, timestamp=NOW + MAX_AGE + 1))  # from the future
    put(tmp_path, ".probe-0-110.json.tmp", "half a wr")  # probe's temp file: not listed
    put(tmp_path, "README.txt", "not a probe file")  # not listed

    result = scan(tmp_path)

    assert result.directory_present
    assert result.files_seen == 9
    assert result.reports == tuple(good)
    assert result.rejected == {"malformed": 3, "too_large": 1, "schema_version": 1, "stale": 2}
    assert set(result.rejected) <= set(REJECT_REASONS)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"pid": "12"}, "pid as string"),
        ({"pid": 0}, "pid zero"),
        ({"cuda_available": 1}, "bool as int"),
        ({"reserved_bytes": 1.5}, "float for int"),
        ({"reserved_bytes": True}, "bool for int"),
        ({"fragmentation_ratio": "0.3"}, "string for float"),
        ({"state": "dancing"}, "unknown state"),
        ({"timestamp": None}, "required null"),
        ({"schema_version": "1"}, "version as string"),
    ],
)
def test_wrong_types_are_malformed(tmp_path: Path, change: dict[str, Any], why: str) -> None:
    data = report().to_dict() | change
    put(tmp_path, "probe-0-1.json", json.dumps(data))
    assert scan(tmp_path).rejected == {"malformed": 1}, why


def test_missing_fields_and_nan_are_malformed(tmp_path: Path) -> None:
    data = report().to_dict()
    del data["state"]
    put(tmp_path, "probe-0-1.json", json.dumps(data))
    no_version = report(pid=2).to_dict()
    del no_version["schema_version"]
    put(tmp_path, "probe-0-2.json", json.dumps(no_version))
    put(tmp_path, "probe-0-3.json", json.dumps(report(pid=3).to_dict()).replace("0.44", "NaN"))
    assert scan(tmp_path).rejected == {"malformed": 3}


def test_unknown_keys_are_ignored(tmp_path: Path) -> None:
    data = report().to_dict() | {"added_in_a_later_probe": [1, 2]}
    put(tmp_path, "probe-0-1.json", json.dumps(data))
    assert scan(tmp_path).reports == (report(),)


def test_missing_directory_is_an_empty_scan(tmp_path: Path) -> None:
    result = scan(tmp_path / "absent")
    assert result == ProbeScan()
    assert not result.directory_present


def test_dead_pid_through_the_injected_check(tmp_path: Path) -> None:
    put_report(tmp_path, report(pid=201))
    put_report(tmp_path, report(pid=202))
    result = scan(tmp_path, pid_alive=lambda r: r.pid != 202)
    assert [r.pid for r in result.reports] == [201]
    assert result.rejected == {"dead_pid": 1}


def test_default_pid_check_in_our_namespace(tmp_path: Path) -> None:
    namespace = own_pid_namespace()
    if namespace is None:
        pytest.skip("no /proc/self/ns/pid here")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    put_report(tmp_path, report(pid=child.pid, pid_namespace=namespace))
    put_report(tmp_path, report(pid=os.getpid(), pid_namespace=namespace))
    # Another pod's namespace: its pids mean nothing here, so it is not judged dead.
    put_report(tmp_path, report(pid=child.pid, pid_namespace="pid:[1]"))
    result = scan_probe_dir(tmp_path, NOW, MAX_AGE)
    assert sorted(r.pid for r in result.reports) == sorted([os.getpid(), child.pid])
    assert result.rejected == {"dead_pid": 1}


def test_duplicate_process_keeps_the_newest(tmp_path: Path) -> None:
    older, newer = report(timestamp=NOW - 20), report(timestamp=NOW - 2)
    put(tmp_path, "probe-0-4242.json", older.to_json())
    put(tmp_path, "probe-copy.json", newer.to_json())
    result = scan(tmp_path)
    assert result.reports == (newer,)
    assert result.rejected == {"duplicate": 1}


def test_too_many_files_are_counted_not_read(tmp_path: Path) -> None:
    for pid in range(1, 8):
        put_report(tmp_path, report(pid=pid))
    result = scan(tmp_path, max_files=5)
    assert len(result.reports) == 5
    assert result.rejected == {"too_many": 2}


def test_non_regular_files_do_not_block_or_crash(tmp_path: Path) -> None:
    (tmp_path / "probe-0-1.json").mkdir()
    os.mkfifo(tmp_path / "probe-0-2.json")  # opening it for reading would block
    target = put_report(tmp_path, report(pid=3))
    (tmp_path / "probe-0-4.json").symlink_to(target)
    result = scan(tmp_path)
    assert [r.pid for r in result.reports] == [3]
    assert result.rejected == {"malformed": 3}


def test_custom_size_limit(tmp_path: Path) -> None:
    put_report(tmp_path, report())
    assert scan(tmp_path, max_bytes=100).rejected == {"too_large": 1}


def test_files_rewritten_faster_than_read(tmp_path: Path) -> None:
    """A probe replacing its file in a loop never shows the reader half a file."""
    stop = threading.Event()
    directory = str(tmp_path)

    def writer() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            write_report(directory, report(pid=77, device_malloc_total=n, timestamp=NOW))

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        deadline = time.monotonic() + 0.5
        scans = 0
        while time.monotonic() < deadline:
            result = scan_probe_dir(directory, NOW, MAX_AGE, pid_alive=None)
            scans += 1
            assert set(result.rejected) <= {"vanished"}
            assert len(result.reports) <= 1
    finally:
        stop.set()
        thread.join()
    assert scans > 0
    final = scan(tmp_path)
    assert [r.pid for r in final.reports] == [77]
    assert not any(name.startswith(".") for name in os.listdir(tmp_path))


def test_format_error_carries_the_reason() -> None:
    with pytest.raises(ProbeFormatError) as info:
        ProbeReport.from_json(b"{")
    assert info.value.reason == "malformed"
    with pytest.raises(ProbeFormatError) as info:
        ProbeReport.from_dict({"schema_version": 99})
    assert info.value.reason == "schema_version"
