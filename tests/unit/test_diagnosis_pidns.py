"""Host pids mapped into their pid namespace, from /proc (a real one and a prepared one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exporter.diagnosis.pidns import ns_pid, ns_pids


def _proc(root: Path, pid: int, namespace: str, nspid: str) -> None:
    d = root / str(pid)
    (d / "ns").mkdir(parents=True)
    (d / "ns" / "pid").symlink_to(namespace)
    (d / "status").write_text(f"Name:\tpython3\nTgid:\t{pid}\nPid:\t{pid}\nNSpid:\t{nspid}\nPPid:\t1\n")


def test_a_containerised_process_maps_to_its_inner_pid(tmp_path: Path) -> None:
    _proc(tmp_path, 81234, "pid:[4026532000]", "81234\t7")
    assert ns_pid(81234, str(tmp_path)) == ("pid:[4026532000]", 7)


def test_nested_namespaces_use_the_innermost(tmp_path: Path) -> None:
    _proc(tmp_path, 500, "pid:[4026532111]", "500\t40\t3")
    assert ns_pid(500, str(tmp_path)) == ("pid:[4026532111]", 3)


def test_missing_or_garbled_entries_map_to_nothing(tmp_path: Path) -> None:
    _proc(tmp_path, 600, "pid:[1]", "600\tx")
    assert ns_pid(600, str(tmp_path)) is None
    assert ns_pid(4_000_000, str(tmp_path)) is None  # the simulator's pids: no process
    assert ns_pids([600, 4_000_000], str(tmp_path)) == frozenset()


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_this_process_maps_to_itself_in_its_own_namespace() -> None:
    assert ns_pid(os.getpid()) == (os.readlink("/proc/self/ns/pid"), os.getpid())
