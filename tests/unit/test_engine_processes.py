"""Local discovery, the engine process tree, and CPU by role, on real processes.

A stand-in `vllm.entrypoints.openai.api_server` module (written to a temporary
directory) serves a captured vLLM page, starts an `EngineCore` child which starts a
`VllmWorker` grandchild, and spins one thread the way a GIL-bound API server does.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from exporter.engines import discovery, process_tree
from exporter.engines.scraper import EngineScraper, ScrapeConfig
from exporter.engines.targets import Target

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "tests" / "fixtures" / "vllm" / "vllm-0.32-cpu-loaded.txt"

SERVER = textwrap.dedent(
    """
    import http.server, subprocess, sys, threading, time

    port = int(sys.argv[sys.argv.index("--port") + 1])
    page = open(sys.argv[sys.argv.index("--page") + 1], "rb").read()
    worker = "import time; time.sleep(300)"
    core = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {worker!r}, 'VllmWorker_TP0']); time.sleep(300)"
    )
    subprocess.Popen([sys.executable, "-c", core, "VLLM::EngineCore"])

    def spin():
        while True:
            pass

    threading.Thread(target=spin, daemon=True).start()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *a):
            pass

    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    pkg = tmp_path / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "vllm", tmp_path / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(SERVER)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--port",
            str(port),
            "--page",
            str(PAGE),
        ],
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        tree = process_tree.tree(proc.pid)
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0 and len(tree) >= 3:
                break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("the stand-in vLLM did not start")
    try:
        yield proc, port
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_the_command_line_names_the_engine() -> None:
    kind = process_tree.engine_kind
    assert kind("/venv/bin/python -m vllm.entrypoints.openai.api_server --model x") == "vllm"
    assert process_tree.engine_kind("/usr/bin/python3 /usr/local/bin/vllm serve meta-llama/x") == "vllm"
    assert process_tree.engine_kind("python3 -m sglang.launch_server --model-path q") == "sglang"
    assert process_tree.engine_kind("text-generation-router --port 80 --prometheus-port 9000") == "tgi"
    assert process_tree.engine_kind("text-generation-launcher --model-id x") is None  # not the HTTP one
    assert process_tree.engine_kind("python train.py --vllm-serve-compat") is None


def test_local_discovery_finds_the_server_its_port_and_its_tree(
    fake_vllm: tuple[subprocess.Popen[bytes], int],
) -> None:
    proc, port = fake_vllm
    found = [t for t in discovery.local_processes() if t.root_pid == proc.pid]
    assert found == [
        Target(url=f"http://127.0.0.1:{port}/metrics", kind="vllm", source="process", root_pid=proc.pid)
    ]
    roles = process_tree.tree(proc.pid)
    assert roles[proc.pid] == "api_server"
    assert sorted(r for r in roles.values() if r) == ["api_server", "engine_core", "worker"]
    assert process_tree.listener_of(port) == proc.pid


@pytest.mark.slow
def test_discovered_engine_is_scraped_with_its_pids_and_cpu_by_role(
    fake_vllm: tuple[subprocess.Popen[bytes], int],
) -> None:
    proc, port = fake_vllm
    mine = [t for t in discovery.local_processes() if t.root_pid == proc.pid]
    scraper = EngineScraper(ScrapeConfig(), discoverers=[lambda: mine])
    scraper.refresh()
    time.sleep(1.0)
    scraper.refresh()
    (t,) = scraper.readings().targets
    assert t.up and t.source == "process" and t.target == f"127.0.0.1:{port}"
    assert proc.pid in t.pids and len(t.pids) == 3
    cpu = {p.role: p.cpu_ratio for p in t.processes}
    assert set(cpu) == {"api_server", "engine_core", "worker"}
    # the API server spins a thread, the worker sleeps (how much of a core the spinner gets
    # depends on what else the machine runs)
    api, worker = cpu["api_server"], cpu["worker"]
    assert api is not None and worker is not None
    assert api > 0.05 and api > 5 * worker, cpu


def test_a_configured_localhost_target_finds_its_processes_by_port(
    fake_vllm: tuple[subprocess.Popen[bytes], int],
) -> None:
    proc, port = fake_vllm
    scraper = EngineScraper(ScrapeConfig(), [Target(url=f"http://localhost:{port}/metrics", kind="vllm")])
    scraper.refresh()
    (t,) = scraper.readings().targets
    assert t.up and proc.pid in t.pids and len(t.pids) == 3


def test_discovery_and_configuration_of_one_engine_make_one_target(
    fake_vllm: tuple[subprocess.Popen[bytes], int],
) -> None:
    proc, port = fake_vllm
    found = [t for t in discovery.local_processes() if t.root_pid == proc.pid]
    scraper = EngineScraper(
        ScrapeConfig(),
        [Target(url=f"http://localhost:{port}/metrics", kind="vllm")],
        discoverers=[lambda: found],
    )
    scraper.refresh()
    (t,) = scraper.readings().targets
    assert t.source == "static" and t.url == f"http://localhost:{port}/metrics"
    assert proc.pid in t.pids


def test_a_vanished_process_stays_a_target_reporting_down(
    fake_vllm: tuple[subprocess.Popen[bytes], int],
) -> None:
    proc, _ = fake_vllm
    found = [t for t in discovery.local_processes() if t.root_pid == proc.pid]
    rounds = iter([found, []])
    scraper = EngineScraper(ScrapeConfig(timeout_s=1.0), discoverers=[lambda: next(rounds)])
    scraper.refresh()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    scraper.refresh(discover=True)
    (t,) = scraper.readings().targets
    assert not t.up and t.scrape_errors and t.scrape_errors["refused"] == 1


def test_cpu_sampler_ignores_processes_without_a_role_and_dead_pids() -> None:
    sampler = process_tree.CpuSampler()
    me = os.getpid()
    assert sampler.sample({me: None, 4_000_000: "worker"}, 1.0) == {}
    assert sampler.sample({me: "api_server"}, 2.0) == {}  # the first sample has no interval
    t0 = time.process_time()
    while time.process_time() - t0 < 0.2:
        pass
    ratio = sampler.sample({me: "api_server"}, 3.0)["api_server"]
    assert 0.1 < ratio < 2.0
    assert psutil.pid_exists(me)


def test_cpulist_and_the_numa_map_from_sysfs(tmp_path: Path) -> None:
    assert process_tree.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert process_tree.parse_cpulist("") == set()
    for node, cpus in (("node0", "0-1"), ("node1", "2-3")):
        (tmp_path / node).mkdir()
        (tmp_path / node / "cpulist").write_text(cpus + "\n")
    (tmp_path / "online").write_text("0-1\n")  # not a node directory
    assert process_tree.cpu_nodes(str(tmp_path)) == {0: 0, 1: 0, 2: 1, 3: 1}
    assert process_tree.cpu_nodes(str(tmp_path / "missing")) == {}


def test_numa_nodes_of_the_gpu_driving_processes() -> None:
    me = os.getpid()
    allowed = sorted(psutil.Process(me).cpu_affinity() or [])
    # pretend every CPU we may run on is on node 1, the others on node 0
    nodes = {cpu: 1 if cpu in allowed else 0 for cpu in range(max(allowed) + 2)}
    assert process_tree.numa_nodes({me: "worker", 1: "api_server"}, nodes) == (1,)
    assert process_tree.numa_nodes({me: "api_server"}, nodes) == (1,)  # no worker: any role
    assert process_tree.numa_nodes({me: None}, nodes) is None
    assert process_tree.numa_nodes({4_000_000: "worker"}, nodes) is None  # not a real process
    assert process_tree.numa_nodes({me: "worker"}, {}) is None  # no NUMA topology known


def test_the_target_reading_carries_the_engines_numa_nodes(
    fake_vllm: tuple[subprocess.Popen[bytes], int],
) -> None:
    proc, port = fake_vllm
    scraper = EngineScraper(ScrapeConfig(), [Target(url=f"http://127.0.0.1:{port}/metrics")])
    scraper.refresh()
    (t,) = scraper.readings().targets
    if not process_tree.cpu_nodes():
        assert t.cpu_numa_nodes is None
        return
    affinity = set(psutil.Process(proc.pid).cpu_affinity() or [])
    nodes = process_tree.cpu_nodes()
    assert t.cpu_numa_nodes == tuple(sorted({nodes[c] for c in affinity if c in nodes}))
