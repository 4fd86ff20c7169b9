"""The probe plugin without vLLM: settings, CUDA detection, sampling and failure paths.

torch is faked through ``sys.modules``: the plugin must only ever look there.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from exporter.probe import plugin
from exporter.probe.reader import scan_probe_dir
from exporter.probe.schema import ProbeState

MiB = 1024 * 1024
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_probe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.delenv(plugin.ENV_DIR, raising=False)
    monkeypatch.delenv(plugin.ENV_INTERVAL, raising=False)
    monkeypatch.setattr(plugin, "DEFAULT_DIR", str(tmp_path / "default-absent"))
    plugin._reset_for_tests()
    yield
    plugin._reset_for_tests()


class FakeCuda:
    def __init__(self, initialized: bool = True, snapshot_error: Exception | None = None):
        self.initialized = initialized
        self.snapshot_error = snapshot_error
        self.snapshot_calls: list[dict[str, Any]] = []
        self.segments = [
            {
                "device": 1,
                "segment_type": "large",
                "total_size": 32 * MiB,
                "blocks": [
                    {"size": 6 * MiB, "state": "inactive"},
                    {"size": 20 * MiB, "state": "active_allocated"},
                    {"size": 2 * MiB, "state": "inactive"},
                    {"size": 4 * MiB, "state": "active_pending_free"},
                ],
            },
            {
                "device": 1,
                "segment_type": "small",
                "total_size": 2 * MiB,
                "blocks": [{"size": 2 * MiB, "state": "inactive"}],
            },
        ]

    def is_initialized(self) -> bool:
        return self.initialized

    def memory_snapshot(self, **kwargs: Any) -> list[dict[str, Any]]:
        self.snapshot_calls.append(kwargs)
        if self.snapshot_error is not None:
            raise self.snapshot_error
        return self.segments

    def memory_stats(self, device: int) -> dict[str, int]:
        assert device == 1
        return {
            "reserved_bytes.all.current": 34 * MiB,
            "allocated_bytes.all.current": 20 * MiB,
            "requested_bytes.all.current": 19 * MiB,
            "inactive_split_bytes.all.current": 8 * MiB,
            "num_alloc_retries": 3,
            "num_ooms": 1,
            "num_device_alloc": 9,
            "num_device_free": 2,
        }

    def current_device(self) -> int:
        raise AssertionError("the probe thread's current device is not the worker's")

    def get_device_properties(self, device: int) -> Any:
        return SimpleNamespace(uuid="0b7f1c2e-1111-2222-3333-444455556666")


def install_fake_torch(
    monkeypatch: pytest.MonkeyPatch, cuda: FakeCuda | None, cuda_version: str | None = "12.8"
) -> ModuleType:
    torch = ModuleType("torch")
    torch.version = SimpleNamespace(cuda=cuda_version, hip=None)  # type: ignore[attr-defined]
    torch.cuda = cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.cuda", ModuleType("torch.cuda"))
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    return torch


def probe_for(tmp_path: Path, interval: float = 15.0) -> plugin.Probe:
    return plugin.Probe(plugin.ProbeConfig(str(tmp_path), interval, True))


def only_report(directory: Path) -> Any:
    result = scan_probe_dir(directory, time.time(), 60, pid_alive=None)
    assert result.rejected == {}
    assert len(result.reports) == 1
    return result.reports[0]


# --- settings ---------------------------------------------------------------------------


def test_inert_without_directory(tmp_path: Path) -> None:
    assert plugin.config_from_env({}) is None
    plugin.register()
    assert plugin.active_probe() is None


def test_default_directory_enables_when_it_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "DEFAULT_DIR", str(tmp_path))
    config = plugin.config_from_env({})
    assert config == plugin.ProbeConfig(str(tmp_path), 15.0, False)


def test_configured_directory_is_created(tmp_path: Path) -> None:
    config = plugin.config_from_env({plugin.ENV_DIR: str(tmp_path / "a" / "b")})
    assert config is not None and config.create_directory


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [(None, 15.0), ("", 15.0), ("30", 30.0), ("7.5", 7.5), ("1", 5.0), ("-3", 5.0),
     ("nan", 5.0), ("soon", 15.0)],
)  # fmt: skip
def test_interval_default_and_floor(raw: str | None, seconds: float) -> None:
    assert plugin.parse_interval(raw) == seconds


@pytest.mark.parametrize(
    ("argv", "env", "port"),
    [
        (["api_server.py", "--model", "m", "--port", "8123"], {}, 8123),
        (["/x/vllm", "serve", "m", "--port=9001"], {}, 9001),
        (["/x/vllm", "serve", "m"], {}, 8000),
        (["/usr/lib/python3/site-packages/vllm/entrypoints/openai/api_server.py"], {}, 8000),
        (["train.py"], {}, None),
        (["train.py", "--port", "http"], {}, None),
        (["x", "--port", "8123"], {plugin.ENV_ENGINE_PORT: "7000"}, 7000),
    ],
)
def test_engine_port(argv: list[str], env: dict[str, str], port: int | None) -> None:
    assert plugin.engine_port_from(argv, env) == port


# --- CUDA detection: never creates a context ----------------------------------------------


def test_state_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert plugin.torch_state(None) == ProbeState.WAITING_FOR_TORCH


def test_state_of_cpu_only_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = install_fake_torch(monkeypatch, FakeCuda(initialized=False), cuda_version=None)
    assert plugin.torch_state(torch) == ProbeState.NO_CUDA


def test_state_before_and_after_cuda_init(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(initialized=False)
    torch = install_fake_torch(monkeypatch, cuda)
    assert plugin.torch_state(torch) == ProbeState.CUDA_NOT_INITIALIZED
    cuda.initialized = True
    assert plugin.torch_state(torch) == ProbeState.SAMPLING


def test_state_while_torch_is_half_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = ModuleType("torch")
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.cuda", ModuleType("torch.cuda"))
    assert plugin.torch_state(torch) == ProbeState.WAITING_FOR_TORCH


# --- sampling ------------------------------------------------------------------------------


def test_sample_reads_stats_and_snapshot_of_the_process_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cuda = FakeCuda()
    torch = install_fake_torch(monkeypatch, cuda)
    fields = plugin.sample_allocator(torch)
    assert cuda.snapshot_calls == [{"include_traces": False}]
    assert fields["device_index"] == 1
    assert fields["uuid"] == "GPU-0b7f1c2e-1111-2222-3333-444455556666"
    assert fields["reserved_bytes"] == 34 * MiB
    assert fields["allocated_bytes"] == 20 * MiB
    assert fields["requested_bytes"] == 19 * MiB
    assert fields["inactive_split_bytes"] == 8 * MiB
    assert (fields["alloc_retries_total"], fields["ooms_total"]) == (3, 1)
    assert (fields["device_malloc_total"], fields["device_free_total"]) == (9, 2)
    assert fields["large_free_blocks"] == 2
    assert fields["large_free_bytes"] == 8 * MiB
    assert fields["largest_free_block_bytes"] == 6 * MiB
    assert fields["fragmentation_ratio"] == pytest.approx(0.25)
    assert fields["fragmentation_sq_ratio"] == pytest.approx(1 - 40 / 64)
    assert fields["snapshot_duration_seconds"] >= 0


def test_step_writes_a_sampling_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_torch(monkeypatch, FakeCuda())
    probe = probe_for(tmp_path, interval=20)
    assert probe.step() == 20
    r = only_report(tmp_path)
    assert r.state == ProbeState.SAMPLING and r.cuda_available
    assert r.pid == os.getpid()
    assert r.largest_free_block_bytes == 6 * MiB
    assert r.interval_seconds == 20


def test_heartbeat_without_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(initialized=False)
    install_fake_torch(monkeypatch, cuda, cuda_version=None)
    probe = probe_for(tmp_path)
    assert probe.step() == 15.0
    r = only_report(tmp_path)
    assert (r.state, r.cuda_available, r.reserved_bytes) == (ProbeState.NO_CUDA, False, None)
    assert cuda.snapshot_calls == []


def test_waiting_probe_polls_and_writes_on_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(initialized=False)
    install_fake_torch(monkeypatch, cuda)
    probe = probe_for(tmp_path)
    assert probe.step() == plugin.POLL_S
    assert only_report(tmp_path).state == ProbeState.CUDA_NOT_INITIALIZED
    writes = probe.writes
    probe.step()
    assert probe.writes == writes  # nothing new to say before the interval
    cuda.initialized = True
    probe.step()
    assert only_report(tmp_path).state == ProbeState.SAMPLING


# --- the thread, registration, failures ------------------------------------------------


def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_register_is_idempotent_and_writes_a_heartbeat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    install_fake_torch(monkeypatch, FakeCuda(initialized=False), cuda_version=None)
    directory = tmp_path / "probes"
    monkeypatch.setenv(plugin.ENV_DIR, str(directory))
    caplog.set_level(logging.INFO, logger=plugin.logger.name)
    plugin.register()
    first = plugin.active_probe()
    plugin.register()
    assert first is not None and plugin.active_probe() is first
    wait_for(lambda: directory.is_dir() and any(directory.iterdir()))
    wait_for(lambda: first.writes >= 1)
    assert only_report(directory).state == ProbeState.NO_CUDA
    started = [m for m in caplog.messages if m.startswith(plugin.LOG_STARTED)]
    assert len(started) == 1 and f"pid {os.getpid()}" in started[0]
    plugin._reset_for_tests()
    assert not any(directory.iterdir())  # stopping removes the file


def test_probe_that_raises_logs_once_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    install_fake_torch(monkeypatch, FakeCuda(snapshot_error=RuntimeError("allocator busted")))
    monkeypatch.setenv(plugin.ENV_DIR, str(tmp_path))
    caplog.set_level(logging.INFO, logger=plugin.logger.name)
    plugin.register()
    probe = plugin.active_probe()
    assert probe is not None
    probe.thread.join(timeout=5)
    assert not probe.thread.is_alive()
    stopped = [m for m in caplog.messages if m.startswith(plugin.LOG_STOPPED)]
    assert len(stopped) == 1
    r = only_report(tmp_path)
    assert r.state == ProbeState.FAILED and r.error is not None
    assert "allocator busted" in r.error


def test_register_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(plugin.ENV_DIR, str(blocker / "probes"))  # can not be created
    plugin.register()
    plugin.register()
    assert plugin.active_probe() is None
    assert len([m for m in caplog.messages if "not started" in m]) <= 1


def test_module_imports_nothing_heavy() -> None:
    code = textwrap.dedent(
        """
        import sys
        before = set(sys.modules)
        import exporter.probe.plugin, exporter.probe.reader
        heavy = {"torch", "numpy", "vllm", "prometheus_client", "pynvml", "httpx",
                 "fastapi", "yaml", "psutil", "multiprocessing", "asyncio"}
        print(sorted(heavy & (set(sys.modules) - before)))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_forked_child_starts_its_own_probe(tmp_path: Path) -> None:
    """Under fork, vLLM does not load plugins again in the child; the probe restarts."""
    code = textwrap.dedent(
        f"""
        import os, sys, time
        os.environ["LLMGPU_PROBE_DIR"] = {str(tmp_path)!r}
        from exporter.probe import plugin
        plugin.register()
        pid = os.fork()
        if pid == 0:
            probe = plugin.active_probe()
            ok = probe is not None and probe.pid == os.getpid() and probe.thread.is_alive()
            deadline = time.monotonic() + 5
            while probe is not None and probe.writes == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            print("child", ok, probe.writes if probe else 0, flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.3)
        print("files", len(os.listdir({str(tmp_path)!r})), os.getpid(), flush=True)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[:2] == ["child", "True"] and int(lines[2]) >= 1
    # The child exited through os._exit: its file stays for the reader to drop as stale.
    assert lines[3:5] == ["files", "2"]
    parent = int(lines[5])
    # The parent exited normally and removed its own file; the child's is left.
    (left,) = os.listdir(tmp_path)
    assert json.loads((tmp_path / left).read_text())["pid"] not in (parent, os.getpid())
