"""The Makefile's promises: `make run` installs only what serving needs and plays the demo
at its default speed; `make test` installs the test extras and checks formatting."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def dry_run(target: str, tmp_path: Path, *args: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # a venv path that does not exist, so make shows every install step it would take
    r = subprocess.run(
        ["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_make_run_installs_only_the_serving_dependencies(tmp_path: Path) -> None:
    out = dry_run("run", tmp_path)
    assert "pip install -q -e ." in out
    assert "[test]" not in out, "make run must not install the test extras"
    assert "serve --simulate healthy --speed 10 " in out


def test_make_run_takes_scenario_and_speed(tmp_path: Path) -> None:
    out = dry_run("run", tmp_path, "SCENARIO=kv-pressure", "SPEED=1")
    assert "serve --simulate kv-pressure --speed 1 " in out


def test_make_test_installs_the_extras_and_checks_formatting(tmp_path: Path) -> None:
    out = dry_run("test", tmp_path)
    assert "pip install -q -e '.[test]'" in out
    assert "ruff format --check" in out and "mypy" in out and "pytest -q" in out
