"""Whether the exporter shares the host's PID namespace, from a prepared /proc."""

from __future__ import annotations

import os
from pathlib import Path

from exporter.config import Settings
from exporter.environment import PROC_PID_INIT_INO, Environment, host_pid_namespace


def _proc(root: Path, link: str) -> str:
    (root / "self/ns").mkdir(parents=True)
    os.symlink(link, root / "self/ns/pid")
    return str(root)


def test_the_initial_namespace_inode_is_the_host(tmp_path: Path) -> None:
    assert host_pid_namespace(_proc(tmp_path, f"pid:[{PROC_PID_INIT_INO}]")) is True
    assert PROC_PID_INIT_INO == 4026531836


def test_any_other_inode_is_a_container(tmp_path: Path) -> None:
    # a pod's own namespace: NSpid there has one entry and /proc/1 is the pod's init,
    # yet the inode tells
    assert host_pid_namespace(_proc(tmp_path, "pid:[4026532481]")) is False


def test_unreadable_proc_is_unknown(tmp_path: Path) -> None:
    assert host_pid_namespace(str(tmp_path)) is None
    assert host_pid_namespace(_proc(tmp_path / "odd", "something else")) is None


def test_the_host_environment_asks_proc() -> None:
    assert Environment(Settings()).host_pid_namespace == host_pid_namespace()
