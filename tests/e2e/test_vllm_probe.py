"""The allocator probe inside a real vLLM (CPU build, so no CUDA anywhere).

vLLM must discover the plugin and call it in each of its processes; each probe must see
that torch has no CUDA, keep a heartbeat file saying so, and vLLM must serve as before.
"""

from __future__ import annotations

import time
from pathlib import Path

from vllm_server import VllmServer

from exporter.probe.plugin import LOG_NO_CUDA, LOG_STARTED, LOG_STOPPED
from exporter.probe.reader import ProbeScan, scan_probe_dir
from exporter.probe.schema import ProbeReport, ProbeState

MAX_AGE_S = 60.0


def vllm_pids(server: VllmServer) -> list[int]:
    """The server's Python processes that load vLLM plugins (not multiprocessing's
    resource tracker, which runs no vLLM code)."""
    pids = []
    for pid in server.pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"resource_tracker" not in cmdline:
            pids.append(pid)
    return pids


def scan(server: VllmServer) -> ProbeScan:
    assert server.probe_dir is not None
    return scan_probe_dir(server.probe_dir, time.time(), MAX_AGE_S)


def reports_by_pid(server: VllmServer, pids: list[int], timeout_s: float = 30) -> dict[int, ProbeReport]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = {r.pid: r for r in scan(server).reports if r.pid in pids}
        if len(found) == len(pids) or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def test_plugin_loads_in_every_vllm_process(vllm_server: VllmServer) -> None:
    vllm_server.ensure_running()
    pids = vllm_pids(vllm_server)
    # API server, EngineCore, one worker: the CPU platform always uses the mp executor.
    assert len(pids) >= 3, pids
    log = vllm_server.log_text()
    for pid in pids:
        assert f"{LOG_STARTED} in pid {pid} " in log, f"no probe start line for pid {pid}"


def test_heartbeat_says_no_cuda_and_parses(vllm_server: VllmServer) -> None:
    vllm_server.ensure_running()
    pids = vllm_pids(vllm_server)
    reports = reports_by_pid(vllm_server, pids)
    assert sorted(reports) == sorted(pids), vllm_server.log_tail()
    log = vllm_server.log_text()
    for pid, report in reports.items():
        assert report.state == ProbeState.NO_CUDA
        assert report.cuda_available is False
        assert report.reserved_bytes is None and report.fragmentation_ratio is None
        assert report.engine_port == vllm_server.port
        assert report.interval_seconds == 5.0
        assert f"{LOG_NO_CUDA} (pid {pid})" in log
    names = {r.process_name for r in reports.values()}
    assert any(name.startswith("EngineCore") for name in names), names
    assert any("Worker" in name for name in names), names
    # Files of servers killed earlier in the session may linger; nothing else is rejected.
    assert set(scan(vllm_server).rejected) <= {"dead_pid", "stale"}


def test_heartbeats_keep_coming(vllm_server: VllmServer) -> None:
    vllm_server.ensure_running()
    pids = vllm_pids(vllm_server)
    before = reports_by_pid(vllm_server, pids)
    time.sleep(6.5)  # longer than the 5 s interval the fixture configures
    after = reports_by_pid(vllm_server, pids)
    for pid in pids:
        assert after[pid].timestamp > before[pid].timestamp, pid


def test_vllm_serves_as_before(vllm_server: VllmServer) -> None:
    vllm_server.ensure_running()
    result = vllm_server.load(6, streaming=3)
    assert [c.completion_tokens for c in result.completions] == [40] * 6
    log = vllm_server.log_text()
    assert LOG_STOPPED not in log
    assert "Failed to load plugin llm_gpu_exporter_probe" not in log
