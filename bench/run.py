"""Benchmark of llm-gpu-exporter on simulated GPUs, with nvitop-exporter as the reference.

    python bench/run.py [--out docs/benchmarks.md] [--quick] [--gpus 1,8,72]

For each GPU count it writes a steady-load scenario (H100 SXM, no inference engine, so
GPU sampling is what is measured) and then, in this order:

1. sampling CPU, in a fresh subprocess (bench/sampling.py): every collector's CPU per
   run, the publish step (compose, enrichers, and the render of both formats with their
   gzip bodies) and the fake library's own share; nvitop-exporter's update loop is timed
   the same way (bench/nvitop_on_fake.py);
2. the memory the diagnosis history takes once it holds its whole span (bench/sampling.py
   --history), to project our RSS at steady state;
3. both exporters served as real subprocesses on loopback against the same fake GPUs:
   process CPU over the same idle wall window (no scrapes), the series each exposes,
   then /metrics latency with one keep-alive client and with 10 concurrent scrapers, for
   a plain request, a gzip request and the request Prometheus sends (OpenMetrics first,
   gzip), and one Prometheus request per publish cycle, in rounds that alternate between
   the exporters; the one not being measured is paused (SIGSTOP), so the two never
   compete for the cores;
4. peak RSS (VmHWM) of each server.

This is a benchmark, not a test: nothing fails when a target is missed; the report says
so. Every loop is bounded in count and in time, everything listens on 127.0.0.1 only,
and every process started here is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata as md
import importlib.util
import json
import math
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
DEFAULT_COUNTS = (1, 8, 72)
OURS, REF = "llm-gpu-exporter", "nvitop-exporter"
SCRAPERS = 10
# What Prometheus 2.x sends by default (scrape.go, scrapeAcceptHeader); its HTTP client
# also asks for gzip.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
MODES: dict[str, dict[str, str]] = {
    "plain": {"accept-encoding": "identity"},
    "gzip": {"accept-encoding": "gzip"},
    "prometheus": {"accept": PROMETHEUS_ACCEPT, "accept-encoding": "gzip"},
}
TARGETS = {
    "p99_ms": {8: 2.0, 72: 10.0},
    "sampling_ms_per_gpu": 1.0,
    "process_core_ratio_8": 0.01,
    "rss_mb": 80.0,
}
STEADY = {
    "util": 0.75,
    "mem_busy": 0.4,
    "sm_active": 0.55,
    "sm_occupancy": 0.35,
    "tensor_active": 0.4,
    "dram_active": 0.45,
    "fp16_active": 0.05,
    "fp32_active": 0.03,
    "memory_used_ratio": 0.9,
    "power_ratio": 0.6,
    "temp_c": 62,
    "mem_temp_c": 66,
    "sm_clock_ratio": 0.95,
    "pcie_tx_bps": 2.0e8,
    "pcie_rx_bps": 3.0e8,
    "nvlink_tx_bps": 6.0e10,
    "nvlink_rx_bps": 6.0e10,
}


@dataclass(frozen=True)
class Plan:
    sequential: int  # requests per mode, one client
    concurrent_each: int  # requests per scraper, SCRAPERS of them
    phase_s: float  # wall cap of one latency phase, all rounds together
    cpu_window_s: float
    sampling_s: float  # wall budget of the measured sampling passes
    nvitop_cycles: int
    spaced: int  # Prometheus requests one publish cycle apart, all rounds together
    rounds: int  # the latency phases are split into this many interleaved rounds
    history_s: float  # wall budget for filling the diagnosis history in-process


FULL = Plan(
    sequential=240,
    concurrent_each=24,
    phase_s=10.0,
    cpu_window_s=15.0,
    sampling_s=6.0,
    nvitop_cycles=30,
    spaced=16,
    rounds=4,
    history_s=60.0,
)
QUICK = Plan(
    sequential=40,
    concurrent_each=5,
    phase_s=4.0,
    cpu_window_s=5.0,
    sampling_s=2.0,
    nvitop_cycles=8,
    spaced=2,
    rounds=2,
    history_s=5.0,
)
ORDINAL = {1: "", 2: "second ", 3: "third ", 4: "fourth "}
SPACED_GAP_S = 1.1  # longer than the 1 s publish interval: every scrape meets a fresh cycle
SETTLE_S = 1.5


# ---- scenarios -------------------------------------------------------------------------


def write_scenario(directory: Path, gpus: int) -> Path:
    """A steady-load H100 node with `gpus` GPUs and no engine (JSON is valid YAML)."""
    scenario = {
        "name": f"bench-{gpus}",
        "description": "benchmark: steady load, no inference engine",
        "gpus": {"count": gpus, "model": "H100-80GB-SXM"},
        "phases": [{"name": "steady", "duration": 86400, "gpu": STEADY}],
    }
    path = directory / f"bench-{gpus}.yaml"
    path.write_text(json.dumps(scenario, indent=1))
    return path


# ---- child processes ---------------------------------------------------------------------


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_json(args: Sequence[str], timeout_s: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    paused: bool = False
    settle_s: float = 0.0  # after a pause, until what it serves is whole again
    started_at: float = field(default_factory=time.monotonic)
    paused_at: float = 0.0
    paused_s: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    @property
    def healthz(self) -> str:
        return f"http://127.0.0.1:{self.port}/healthz"

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True
        self.paused_at = time.monotonic()

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False
        self.paused_s += time.monotonic() - self.paused_at

    def running_s(self) -> float:
        """Seconds it has been up and not paused: about the cycles it has published."""
        return time.monotonic() - self.started_at - self.paused_s

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        if self.paused:
            self.resume()
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def status(self) -> dict[str, int]:
        """VmHWM and VmRSS in KiB, from /proc."""
        out = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(value.split()[0])
        return out

    def cpu_seconds(self) -> float:
        t = psutil.Process(self.proc.pid).cpu_times()
        return float(t.user + t.system)


def start(name: str, args: Sequence[str], port: int, logdir: Path) -> Server:
    log = logdir / f"{name}-{port}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=child_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Server(name, proc, port, log)


def start_ours(scenario: Path, logdir: Path) -> Server:
    port = free_port()
    args = ["-m", "exporter.cli", "serve", "--scenario-file", str(scenario)]
    args += ["--listen", f"127.0.0.1:{port}", "--interval", "1"]
    server = start("llm-gpu-exporter", args, port, logdir)
    server.settle_s = SETTLE_S
    return server


def start_nvitop(scenario: Path, logdir: Path) -> Server:
    port = free_port()
    args = [str(BENCH / "nvitop_on_fake.py"), str(scenario), "--"]
    args += ["--hostname", "bench", "--bind-address", "127.0.0.1", "--port", str(port), "--interval", "1"]
    return start("nvitop-exporter", args, port, logdir)


def wait_ready(server: Server, gpus: int, timeout_s: float = 90.0) -> None:
    """Ours: /readyz answers 200. nvitop-exporter: /metrics shows every GPU."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                raise RuntimeError(f"{server.name} exited: {server.log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if server.name == "llm-gpu-exporter":
                    if client.get(f"http://127.0.0.1:{server.port}/readyz").status_code == 200:
                        return
                else:
                    body = client.get(server.url).text
                    if body.count("gpu_utilization_Percentage{") >= gpus:
                        return
            time.sleep(0.25)
    raise RuntimeError(f"{server.name} was not ready after {timeout_s:.0f} s")


class Contention:
    """CPU the whole machine spent (from /proc/stat, steal included) against what this
    benchmark spent (this process and every child it has reaped), over a span of time."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.busy0 = self._busy()
        self.own0 = self._own()

    @staticmethod
    def _busy() -> float:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own() -> float:
        t = psutil.Process().cpu_times()
        return float(t.user + t.system + t.children_user + t.children_system)

    def result(self) -> dict[str, float]:
        """Cores used on average: by the benchmark, and by everything else on the machine.
        Call it once every child started since has been reaped."""
        wall = time.monotonic() - self.t0
        busy = self._busy() - self.busy0
        own = self._own() - self.own0
        return {"wall_s": wall, "ours_cores": own / wall, "others_cores": max(0.0, busy - own) / wall}


# ---- scraping ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    seconds: float  # until the whole body (as sent, not decoded) has arrived
    size: int  # bytes of the body as sent
    served: str  # what came back: the format and the content encoding


def served_as(headers: httpx.Headers) -> str:
    kind = headers.get("content-type", "").split(";")[0].strip()
    fmt = {"application/openmetrics-text": "OpenMetrics", "text/plain": "text format"}.get(kind, kind)
    return f"{fmt}, {headers.get('content-encoding', 'identity')}"


def _scrape(client: httpx.Client, url: str, headers: dict[str, str]) -> Reply:
    t0 = time.perf_counter()
    with client.stream("GET", url, headers=headers) as r:
        size = sum(len(chunk) for chunk in r.iter_raw())
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}")
    return Reply(time.perf_counter() - t0, size, served_as(r.headers))


@dataclass
class Latency:
    seconds: list[float] = field(default_factory=list)
    size: int = 0
    served: str = ""
    wall_s: float = 0.0
    offsets: list[float] = field(default_factory=list)  # seconds from the nearest publish end

    def add(self, reply: Reply) -> None:
        self.seconds.append(reply.seconds)
        self.size = reply.size
        self.served = reply.served

    def p(self, q: float) -> float:
        """Nearest-rank percentile, in milliseconds."""
        data = sorted(self.seconds)
        if not data:
            return float("nan")
        rank = max(0, min(len(data) - 1, math.ceil(q / 100 * len(data)) - 1))
        return data[rank] * 1000

    @property
    def rate(self) -> float:
        return len(self.seconds) / self.wall_s if self.wall_s else float("nan")


def sequential(
    client: httpx.Client, url: str, headers: dict[str, str], n: int, cap_s: float, into: Latency
) -> None:
    """Up to n requests one after another on one keep-alive client."""
    start_t = time.monotonic()
    done = 0
    while done < n and time.monotonic() - start_t < cap_s:
        into.add(_scrape(client, url, headers))
        done += 1
    into.wall_s += time.monotonic() - start_t


def concurrent(url: str, headers: dict[str, str], each: int, cap_s: float, into: Latency) -> None:
    """SCRAPERS threads, a client each, up to `each` requests each after one untimed one."""
    lock = threading.Lock()
    barrier = threading.Barrier(SCRAPERS + 1)
    deadline: list[float] = []

    def scraper() -> None:
        mine: list[Reply] = []
        with httpx.Client(timeout=30.0) as client:
            _scrape(client, url, headers)
            barrier.wait()
            while len(mine) < each and time.monotonic() < deadline[0]:
                mine.append(_scrape(client, url, headers))
        with lock:
            for reply in mine:
                into.add(reply)

    threads = [threading.Thread(target=scraper, daemon=True) for _ in range(SCRAPERS)]
    for t in threads:
        t.start()
    deadline.append(time.monotonic() + cap_s + 30)  # set before anyone passes the barrier
    barrier.wait()
    deadline[0] = time.monotonic() + cap_s
    start_t = time.monotonic()
    for t in threads:
        t.join(cap_s + 60)
    into.wall_s += time.monotonic() - start_t


def publish_offset(client: httpx.Client, server: Server, began: float) -> float:
    """Where in our publish cycle a request began: seconds after the end of the nearest
    publish step (negative: before it), from /readyz's sample age, asked just after.

    `rendered_at` is taken on the monotonic clock, which this process shares."""
    asked = time.monotonic()
    age = float(client.get(f"http://127.0.0.1:{server.port}/readyz").json()["sample_age_seconds"])
    end = (asked + time.monotonic()) / 2 - age  # the latest publish end
    off = (began - end) % 1.0  # the interval is 1 s
    return off - 1.0 if off >= 0.5 else off


@contextlib.contextmanager
def alone(server: Server, servers: Sequence[Server]) -> Iterator[None]:
    """Pause every other exporter; on resume give them a cycle to catch up again."""
    others = [o for o in servers if o is not server]
    for o in others:
        o.pause()
    try:
        yield
    finally:
        for o in others:
            o.resume()
    # Ours, resumed, publishes at once, possibly before its collectors have run again, and
    # leaves out readings it considers stale; the next cycle is whole. nvitop-exporter's
    # registry just keeps its last values.
    time.sleep(max((o.settle_s for o in others), default=0.0))


def latencies(servers: Sequence[Server], plan: Plan, gpus: int) -> dict[str, dict[str, dict[str, Latency]]]:
    """Every exporter, mode and concurrency, interleaved in rounds.

    Other people's jobs come and go on the shared cores; measuring in rounds
    (exporter A, exporter B, A, B, ...) spreads that drift over both instead of letting
    it land on one of them.
    """
    out = {
        s.name: {
            "one": {m: Latency() for m in MODES},
            "ten": {m: Latency() for m in MODES},
            "cycle": {"prometheus": Latency(), "healthz": Latency()},
        }
        for s in servers
    }
    clients = {s.name: httpx.Client(timeout=30.0) for s in servers}
    n = math.ceil(plan.sequential / plan.rounds)
    each = math.ceil(plan.concurrent_each / plan.rounds)
    spaced = math.ceil(plan.spaced / plan.rounds)
    cap = plan.phase_s / plan.rounds
    try:
        for s in servers:
            with alone(s, servers):
                for headers in MODES.values():  # connection, first requests of each kind
                    for _ in range(3):
                        _scrape(clients[s.name], s.url, headers)
        for r in range(plan.rounds):
            log(f"{gpus} GPU(s): scraping, round {r + 1} of {plan.rounds}")
            for s in servers:
                with alone(s, servers):
                    for mode, headers in MODES.items():
                        sequential(clients[s.name], s.url, headers, n, cap, out[s.name]["one"][mode])
                    for mode, headers in MODES.items():
                        concurrent(s.url, headers, each, cap, out[s.name]["ten"][mode])
                    for _ in range(spaced):  # as Prometheus scrapes: each meets a new cycle
                        time.sleep(SPACED_GAP_S)
                        began = time.monotonic()
                        lat = out[s.name]["cycle"]["prometheus"]
                        lat.add(_scrape(clients[s.name], s.url, MODES["prometheus"]))
                        if s.name == OURS:
                            lat.offsets.append(publish_offset(clients[s.name], s, began))
                            # the same pause before a request that does nothing
                            time.sleep(SPACED_GAP_S)
                            out[s.name]["cycle"]["healthz"].add(_scrape(clients[s.name], s.healthz, {}))
    finally:
        for c in clients.values():
            c.close()
    return out


# ---- exposition contents ---------------------------------------------------------------------

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)")


def series_stats(body: str, gpus: int) -> dict[str, Any]:
    total = per_gpu = nan = 0
    families: set[str] = set()
    nan_families: set[str] = set()
    value_families: set[str] = set()
    for line in body.splitlines():
        if line.startswith("# TYPE "):
            families.add(line.split()[2])
            continue
        m = SAMPLE.match(line)
        if not m:
            continue
        total += 1
        name, labels, value = m.groups()
        if labels and 'uuid="GPU-' in labels:
            per_gpu += 1
            if value == "NaN":
                nan += 1
                nan_families.add(name)
            else:
                value_families.add(name)
    return {
        "series": total,
        "families": len(families),
        "gpu_series_per_gpu": per_gpu / gpus,
        "gpu_nan_per_gpu": nan / gpus,
        "nan_only_families": sorted(nan_families - value_families),
    }


def fetch(url: str) -> str:
    with httpx.Client(timeout=30.0) as client:
        return client.get(url, headers={"accept-encoding": "identity"}).text


def missing_symbols(log: Path) -> list[str]:
    prefix = "nvitop-on-fake: missing NVML symbol "
    text = log.read_text(errors="replace") if log.exists() else ""
    return sorted({line[len(prefix) :].strip() for line in text.splitlines() if line.startswith(prefix)})


# ---- one GPU count ---------------------------------------------------------------------------


def sampling_summary(raw: dict[str, Any]) -> dict[str, Any]:
    """Per-cycle CPU at the default intervals (a 5 s collector counts 1/5 per 1 s cycle)."""
    n = raw["gpus"]
    cycle = raw["cycle_interval_s"]
    nvml = {k: v for k, v in raw["collectors"].items() if v["nvml"]}
    node = {k: v for k, v in raw["collectors"].items() if not v["nvml"]}

    def share(c: dict[str, Any]) -> float:
        return float(cycle / max(cycle, c["interval_s"]))

    collect = sum(c["cpu_s"] * share(c) for c in nvml.values())
    fake = sum(min(c["fake_cpu_s"], c["cpu_s"]) * share(c) for c in nvml.values())
    every = sum(c["cpu_s"] for c in nvml.values())
    calls = sum(c["fake_calls"] * share(c) for c in nvml.values())
    return {
        "gpus": n,
        "passes": raw["passes"],
        "collect_ms_per_gpu": collect * 1000 / n,
        "collect_nofake_ms_per_gpu": (collect - fake) * 1000 / n,
        "fake_share": fake / collect if collect else 0.0,
        "every_collector_ms_per_gpu": every * 1000 / n,
        "calls_per_gpu": calls / n,
        "node_ms": sum(c["cpu_s"] * share(c) for c in node.values()) * 1000,
        "publish_ms": raw["publish_s"] * 1000,
        "render_ms": raw["render_s"] * 1000,
        "gzip_ms": raw["gzip_s"] * 1000,
        "gzip_level": raw["gzip_level"],
        "gc": raw["gc"],
        "cycle_ms": (collect + raw["publish_s"]) * 1000
        + sum(c["cpu_s"] * share(c) for c in node.values()) * 1000,
        "period_runs": raw["period_runs"],
        "text_bytes": raw["text_bytes"],
        "text_gzip_bytes": raw["text_gzip_bytes"],
        "openmetrics_bytes": raw["openmetrics_bytes"],
        "openmetrics_gzip_bytes": raw["openmetrics_gzip_bytes"],
        "micro": raw["micro"],
        "collectors": raw["collectors"],
        "threads_alive": raw["threads_alive"],
    }


def bench_count(gpus: int, plan: Plan, workdir: Path, with_nvitop: bool) -> dict[str, Any]:
    scenario = write_scenario(workdir, gpus)
    result: dict[str, Any] = {"gpus": gpus, "load": [os.getloadavg()[0]]}
    contention = Contention()
    log(f"{gpus} GPU(s): sampling CPU")
    raw = run_json(
        [str(BENCH / "sampling.py"), str(scenario), "--budget", str(plan.sampling_s)], timeout_s=240
    )
    result["sampling"] = sampling_summary(raw)
    if with_nvitop:
        nv = run_json(
            [str(BENCH / "nvitop_on_fake.py"), str(scenario), "--time-cycles", str(plan.nvitop_cycles)],
            timeout_s=240,
        )
        nv["devices_ms_per_gpu"] = nv["devices_s"] * 1000 / gpus
        nv["devices_nofake_ms_per_gpu"] = max(0.0, nv["devices_s"] - nv["fake_cpu_s"]) * 1000 / gpus
        nv["calls_per_gpu"] = nv["fake_calls"] / gpus
        result["nvitop_sampling"] = nv

    log(f"{gpus} GPU(s): diagnosis history")
    result["history"] = run_json(
        [str(BENCH / "sampling.py"), str(scenario), "--history", "--budget", str(plan.history_s)],
        timeout_s=240,
    )

    servers: list[Server] = []
    try:
        log(f"{gpus} GPU(s): serving")
        ours = start_ours(scenario, workdir)
        servers.append(ours)
        theirs = start_nvitop(scenario, workdir) if with_nvitop else None
        if theirs is not None:
            servers.append(theirs)
        for s in servers:
            wait_ready(s, gpus)
        time.sleep(2.0)  # a few cycles: GPM has two samples, nvitop's loop is running

        before = {s.name: s.cpu_seconds() for s in servers}
        t0 = time.monotonic()
        time.sleep(plan.cpu_window_s)
        window = time.monotonic() - t0
        result["cpu_window_s"] = window
        result["idle_cpu"] = {s.name: (s.cpu_seconds() - before[s.name]) / window for s in servers}

        # Before anyone is paused: a paused exporter's readings go stale, and right after it
        # resumes its first snapshot leaves out the GPUs whose collectors have not run again.
        result["series"] = {s.name: series_stats(fetch(s.url), gpus) for s in servers}
        result["latency"] = latencies(servers, plan, gpus)
        result["rss_kib"] = {s.name: s.status() for s in servers}
        result["ours_running_s"] = ours.running_s()
        if theirs is not None:
            result["missing_symbols"] = missing_symbols(theirs.log)
    finally:
        for s in servers:
            s.stop()
    result["load"].append(os.getloadavg()[0])
    result["contention"] = contention.result()
    return result


# ---- report ------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def source_state() -> str:
    """The commit measured, and whether the package had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "exporter"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"commit {head}" + (" with uncommitted changes under exporter/" if dirty else "")


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = psutil.virtual_memory().total
    return {
        "cpu": model or platform.processor(),
        "cores": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "memory_gib": mem / 1024**3,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def ms(x: float) -> str:
    if x != x:  # NaN
        return "n/a"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def kb(n: float) -> str:
    return f"{n / 1024:.0f} KiB" if n >= 10240 else f"{n / 1024:.1f} KiB"


def mb(kib: float) -> float:
    return kib * 1024 / 1e6


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


MODE_LABELS = (("plain", "plain"), ("gzip", "gzip"), ("prometheus", "Prometheus' request"))
MODE_SHORT = (("plain", "plain"), ("gzip", "gzip"), ("prometheus", "Prometheus"))


class Doc:
    """Markdown lines, with table helpers."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, *parts: str) -> None:
        self.lines.append("".join(parts))

    def para(self, *parts: str) -> None:
        self.lines.append(" ".join(parts))
        self.lines.append("")

    def table(self, head: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        self.lines.append("| " + " | ".join(head) + " |")
        self.lines.append("|" + "---|" * len(head))
        for r in rows:
            self.lines.append("| " + " | ".join(r) + " |")
        self.lines.append("")

    def text(self) -> str:
        return "\n".join(self.lines).rstrip() + "\n"


def frames_held(h: dict[str, Any], seconds: float) -> float:
    """Frames the diagnosis history holds after `seconds` of one-second cycles: every one
    of the last `dense_s`, one per `sparse_step_s` before, at most `history_seconds`."""
    t = min(seconds, float(h["history_seconds"]))
    dense = min(t, float(h["dense_s"]))
    return dense + (t - dense) / float(h["sparse_step_s"])


def projected_rss_kib(r: dict[str, Any]) -> float:
    """Our peak RSS once the diagnosis history is full: what was measured, plus the
    memory per held frame (measured in-process, history filled to its steady state) for
    the frames the served exporter did not hold yet."""
    h = r["history"]
    missing = frames_held(h, h["history_seconds"]) - frames_held(h, float(r["ours_running_s"]))
    return float(r["rss_kib"][OURS]["VmHWM"] + h["kib_per_frame"] * max(0.0, missing))


def plan_of(meta: dict[str, Any]) -> Plan:
    return QUICK if meta["quick"] else FULL


def report(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    with_ref = meta["nvitop"] == "used"
    by = {r["gpus"]: r for r in results}
    d = Doc()
    d("# Benchmarks")
    d("")
    d.para(
        "Generated by `bench/run.py` (do not edit by hand: change the script and run it again).",
        "A benchmark, not a test: a missed target is reported here, nothing fails.",
    )
    d(f"Command: `{meta['command']}`" + (" (the short form: small samples)" if meta["quick"] else ""))
    d("")
    d(f"Run: {meta['date']}, {meta['duration_s']:.0f} s in all, on {meta['source']}.")
    d("")
    machine_section(d, meta, with_ref)
    targets_section(d, by)
    findings_section(d, by, with_ref)
    for n in sorted(by):
        count_section(d, by[n], with_ref)
    breakdown_section(d, by)
    if with_ref:
        reference_section(d, results, meta)
    method_section(d, meta)
    return d.text()


def machine_section(d: Doc, meta: dict[str, Any], with_ref: bool) -> None:
    m = meta["machine"]
    d("## Machine")
    d("")
    d(
        f"- CPU: {m['cpu']}, {m['cores']} cores ({m['affinity']} usable by the benchmark), "
        f"{m['memory_gib']:.0f} GiB memory; Linux {m['kernel']}; Python {m['python']}; no GPU."
    )
    c = meta["contention"]
    d(
        f"- **The {m['cores']} cores are shared** with other people's test suites: over the run, "
        f"other processes used {c['others_cores']:.2f} of them on average and this benchmark "
        f"{c['ours_cores']:.2f} (from /proc/stat, steal time included; 1-minute load average "
        f"{meta['load_before']:.2f} at the start, {meta['load_after']:.2f} at the end; each GPU "
        "count's part below says the same for its own span). Absolute figures carry that noise, "
        "tails most of all. Compare the two exporters within this run rather than with another run."
    )
    d(
        "- Both exporters read the simulator's fake NVML library (`exporter/sim/fakenvml.py`) "
        f"through nvidia-ml-py {meta['versions']['nvidia-ml-py']}."
    )
    vers = ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if k != "nvidia-ml-py")
    d(f"- Versions: {vers}.")
    if not with_ref:
        d(f"- **nvitop-exporter was not measured**: {meta['nvitop_reason']}")
    d("")


def spot(offset: float) -> str:
    """Where a request began, against the end of the nearest publish step."""
    if abs(offset) < 0.0005:
        return "begun as a publish step ended"
    return f"begun {abs(offset) * 1000:.0f} ms {'before' if offset < 0 else 'after'} a publish step ended"


def slow_spots(lat: Latency, factor: float = 2.0) -> list[tuple[float, float]]:
    """(milliseconds, offset) of the requests slower than `factor` times the median."""
    if not lat.offsets:
        return []
    limit = factor * lat.p(50) / 1000
    return sorted(
        ((sec * 1000, off) for sec, off in zip(lat.seconds, lat.offsets, strict=True) if sec > limit),
        reverse=True,
    )


def verdicts(values: dict[str, float], limit: float) -> str:
    """One verdict for several request kinds: which of them met the limit."""
    met = [label for label, v in values.items() if v <= limit]
    missed = [label for label, v in values.items() if not v <= limit]
    if not missed:
        return verdict(True) + (" (all three)" if len(values) == 3 else "")
    if not met:
        return verdict(False) + (" (all three)" if len(values) == 3 else "")
    return f"{verdict(True)}: {', '.join(met)}; {verdict(False)}: {', '.join(missed)}"


def targets_section(d: Doc, by: dict[int, dict[str, Any]]) -> None:
    d("## Targets")
    d("")
    rows = []
    for n, limit in TARGETS["p99_ms"].items():
        r = by.get(n)
        if r is None:
            continue
        lat = r["latency"][OURS]
        for key, label in (("one", "one scraper"), ("ten", f"{SCRAPERS} concurrent scrapers")):
            p99 = {short: lat[key][mode].p(99) for mode, short in MODE_SHORT}
            rows.append(
                [
                    f"/metrics p99 ≤ {limit:g} ms at {n} GPUs, {label}",
                    ", ".join(f"{short} {ms(v)} ms" for short, v in p99.items()),
                    verdicts(p99, limit),
                ]
            )
        cyc, hz = lat["cycle"]["prometheus"], lat["cycle"]["healthz"]
        rows.append(
            [
                f"the same, Prometheus' request once per publish cycle ({n} GPUs)",
                f"max {ms(cyc.p(100))} ms, median {ms(cyc.p(50))} ms (n={len(cyc.seconds)}); "
                f"`/healthz` after the same pause: median {ms(hz.p(50))} ms",
                verdict(cyc.p(100) <= limit) + " (max)",
            ]
        )
    for n in sorted(by):
        s = by[n]["sampling"]
        limit = TARGETS["sampling_ms_per_gpu"]
        rows.append(
            [
                f"sampling ≤ {limit:g} ms CPU per GPU per cycle, {n} GPU{'s' if n > 1 else ''}",
                f"{ms(s['collect_ms_per_gpu'])} ms on the fake, "
                f"{ms(s['collect_nofake_ms_per_gpu'])} ms without the fake's own share",
                f"{verdict(s['collect_ms_per_gpu'] <= limit)} on the fake, "
                f"{verdict(s['collect_nofake_ms_per_gpu'] <= limit)} without it",
            ]
        )
    if 8 in by:
        s = by[8]["sampling"]
        sampling = s["collect_ms_per_gpu"] * 8 / 1000
        proc = by[8]["idle_cpu"][OURS]
        limit = TARGETS["process_core_ratio_8"]
        rows.append(
            [
                "≤ 1 % of one core at 1 s for 8 GPUs",
                f"sampling {sampling * 100:.2f} %; the whole serving process, idle "
                f"(sampling + publish + server) {proc * 100:.1f} %",
                f"{verdict(sampling <= limit)} for sampling, {verdict(proc <= limit)} for the process",
            ]
        )
    for n in sorted(by):
        r = by[n]
        hwm = mb(r["rss_kib"][OURS]["VmHWM"])
        full = mb(projected_rss_kib(r))
        limit = TARGETS["rss_mb"]
        rows.append(
            [
                f"peak RSS ≤ {limit:g} MB, {n} GPU{'s' if n > 1 else ''}",
                f"{hwm:.1f} MB after {r['ours_running_s']:.0f} s of serving; about {full:.0f} MB once "
                f"the diagnosis history holds its full {r['history']['history_seconds']:.0f} s",
                f"{verdict(hwm <= limit)} as measured, {verdict(full <= limit)} at steady state",
            ]
        )
    d.table(["target", "measured", "verdict"], rows)


def findings_section(d: Doc, by: dict[int, dict[str, Any]], with_ref: bool) -> None:
    d("## What the numbers say")
    d("")
    big = max(by)
    s = by[big]["sampling"]
    ours = by[big]["latency"][OURS]
    collect_ms = s["collect_ms_per_gpu"] * big
    lead = (
        "Publishing costs more than sampling"
        if s["publish_ms"] > collect_ms
        else "Sampling costs more than publishing"
    )
    gc_line = (
        f" Garbage collection, inside those figures, took {ms(s['gc']['per_pass_s'] * 1000)} ms "
        f"per cycle on average ({s['gc']['full_collections']} full collections in "
        f"{s['passes']} cycles, up to {ms(s['gc']['full_max_s'] * 1000)} ms each)."
    )
    d(
        f"- **{lead}.** At {big} GPUs one cycle spends {ms(collect_ms)} ms of CPU sampling on the "
        f"fake ({ms(s['collect_nofake_ms_per_gpu'] * big)} ms without the fake's own share) and "
        f"{ms(s['publish_ms'])} ms publishing, every second, scraped or not. Of the publish step, "
        f"the render of both formats with both gzip bodies takes {ms(s['render_ms'])} ms "
        f"(gzip {ms(s['gzip_ms'])} ms of it); composing the snapshot and the enrichers (the "
        f"diagnosis) take the rest.{gc_line}"
    )
    cyc, hz = ours["cycle"]["prometheus"], ours["cycle"]["healthz"]
    one = ours["one"]
    d(
        f"- **Every request is served from bytes made before it arrived.** Prometheus' request "
        f"got back {cyc.served or 'nothing'} ({kb(cyc.size)} at {big} GPUs; the plain text format "
        f"is {kb(one['plain'].size)}); rapid-fire on one connection it took "
        f"{ms(one['prometheus'].p(50))} ms at the median and {ms(one['prometheus'].p(99))} ms at "
        "p99."
    )
    slow = slow_spots(cyc)
    where = "; ".join(f"{ms(v)} ms {spot(off)}" for v, off in slow)
    wake = (
        f"against {ms(one['prometheus'].p(50))} ms rapid-fire: most of that median is waking an "
        "idle server (and, on this virtual machine, idle cores)"
        if hz.p(50) >= 0.6 * cyc.p(50)
        else f"against {ms(one['prometheus'].p(50))} ms rapid-fire"
    )
    meet = (
        f" The slow ones (over twice the median): {where}. A request that arrives while the "
        f"publish thread runs ({ms(s['publish_ms'])} ms of CPU per cycle at {big} GPUs) waits for "
        "the GIL, and a full (generation 2) garbage collection holds the GIL from start to end: "
        f"{s['gc']['full_collections']} of them ran during the {s['passes']} measured sampling "
        f"passes at {big} GPUs, the longest {ms(s['gc']['full_max_s'] * 1000)} ms. Prometheus "
        "scrapes a target at a fixed offset within its interval and our cycle drifts only "
        "slowly against it, so on a node where the two line up, consecutive scrapes would meet "
        "the publish step."
        if slow
        else " None was slower than twice the median."
    )
    d(
        "- **Scraped once per cycle, as Prometheus does, a request pays for finding the server "
        f"idle.** The {len(cyc.seconds)} requests, {SPACED_GAP_S:g} s apart, land at points "
        f"spread over the 1 s cycle. At {big} GPUs their median was {ms(cyc.p(50))} ms; "
        f"`/healthz`, which does nothing, took {ms(hz.p(50))} ms at the median after the same "
        f"pause, {wake}.{meet}"
    )
    tails = "; ".join(
        f"{n} GPU{'s' if n > 1 else ''}: "
        + ", ".join(
            f"{short} {ms(by[n]['latency'][OURS]['one'][mode].p(50))} / "
            f"{ms(by[n]['latency'][OURS]['one'][mode].p(99))} ms"
            for mode, short in MODE_SHORT
        )
        for n in sorted(by)
    )
    count = len(one["gzip"].seconds)
    slowest = count - math.ceil(0.99 * count) + 1
    d(
        "- **Rapid-fire p99 is decided by a few slow requests.** All three request kinds pick "
        f"cached bytes, yet their one-scraper p50 / p99 differ ({tails}), and which kind has the "
        "worst p99 changes from run to run. With "
        f"{count} requests, p99 is the {ORDINAL.get(slowest, f'{slowest}th ')}slowest. "
        "Sampling and publishing run on threads of the serving process, under the same GIL as "
        f"the request handlers (at {big} GPUs they keep "
        f"{by[big]['idle_cpu'][OURS] * 100:.0f} % of a core busy with nobody scraping), and the "
        "back-to-back requests of one phase take a few hundred ms in all: whether a phase "
        "overlaps those bursts, or other people's jobs on the two shared cores, decides it. "
        f"Under {SCRAPERS} scrapers (and their client threads, which share one interpreter "
        "in the benchmark process) the gzip p99 was "
        + ", ".join(f"{ms(by[n]['latency'][OURS]['ten']['gzip'].p(99))} ms at {n}" for n in sorted(by))
        + " GPUs."
    )
    h = by[big]["history"]
    steady = frames_held(h, h["history_seconds"])
    small = min(by)
    d(
        f"- **The diagnosis history is small now; the rest of the memory grows with the GPU "
        f"count.** At steady state the history holds {steady:.0f} frames for its "
        f"{h['history_seconds']:.0f} s span (every frame of the last {h['dense_s']:.0f} s, one "
        f"per {h['sparse_step_s']:.0f} s before); filled to that state in a separate process it "
        f"took {mb(h['rss_after_kib'] - h['rss_before_kib']):.1f} MB at {big} GPUs "
        f"({h['kib_per_frame']:.0f} KiB per frame held). The modules alone (the exporter, "
        f"FastAPI, uvicorn) take {mb(h['rss_imports_kib']):.0f} MB; building the exporter on "
        f"{big} fake GPUs and running three cycles without rendering or serving added "
        f"{mb(h['rss_before_kib'] - h['rss_imports_kib']):.0f} MB in that process; the served "
        f"exporter's VmRSS was {mb(by[big]['rss_kib'][OURS]['VmRSS']):.0f} MB at the end "
        f"(peak {mb(by[big]['rss_kib'][OURS]['VmHWM']):.0f} MB)."
        + (
            f" From {small} to {big} GPUs our peak grew by "
            f"{mb(by[big]['rss_kib'][OURS]['VmHWM'] - by[small]['rss_kib'][OURS]['VmHWM']):.0f} MB, "
            "nvitop-exporter's, on the same fake library, by "
            f"{mb(by[big]['rss_kib'][REF]['VmHWM'] - by[small]['rss_kib'][REF]['VmHWM']):.0f} MB: "
            "that bounds what the fake itself takes."
            if with_ref and small != big
            else ""
        )
    )
    if with_ref:
        ours_s = by[big]["series"][OURS]
        ref_s = by[big]["series"][REF]
        nvlink = by[big]["sampling"]["collectors"]["nvlink"]["fake_calls"] / big
        d(
            f"- **We collect more.** {ours_s['gpu_series_per_gpu']:.0f} GPU series per GPU against "
            f"nvitop-exporter's {ref_s['gpu_series_per_gpu']:.0f} (of which "
            f"{ref_s['gpu_nan_per_gpu']:.0f} were NaN on the fake), from "
            f"{s['calls_per_gpu']:.0f} NVML calls per GPU per cycle against the "
            f"{by[big]['nvitop_sampling']['calls_per_gpu']:.0f} of its calls that the fake could "
            f"answer. The NVLink collector makes {nvlink:.0f} of ours on average (one field-values "
            "call for the byte counters every run; state and four error counters per link, 90 "
            f"calls, one run in {s['period_runs']}). Sampling per GPU still costs us "
            f"{s['collect_ms_per_gpu'] / by[big]['nvitop_sampling']['devices_ms_per_gpu']:.1f} times "
            "what it costs nvitop-exporter on the fake."
        )
        ten_ref = by[big]["latency"][REF]["ten"]["gzip"]
        ten_ours = ours["ten"]["gzip"]
        backlog = (
            " Its server (prometheus_client's WSGI server) renders every scrape, speaks HTTP/1.0 "
            "(a new connection per request) and listens with a backlog of 5; with 10 clients "
            "connecting at once, connection attempts beyond the backlog are dropped and retried "
            "by the client's TCP after a second, which is what its p99 of a second or more looks "
            "like."
            if ten_ref.p(99) >= 900
            else " Its server (prometheus_client's WSGI server) renders every scrape."
        )
        d(
            f"- **Under {SCRAPERS} concurrent scrapers** we served {ten_ours.rate:.0f} gzip "
            f"requests/s at {big} GPUs (p99 {ms(ten_ours.p(99))} ms), nvitop-exporter "
            f"{ten_ref.rate:.0f} (p99 {ms(ten_ref.p(99))} ms).{backlog}"
        )
    d("")


def count_section(d: Doc, r: dict[str, Any], with_ref: bool) -> None:
    n = r["gpus"]
    s = r["sampling"]
    nv = r.get("nvitop_sampling", {})
    cols = [OURS, REF] if with_ref else [OURS]
    nan = float("nan")
    d(f"## {n} GPU{'s' if n > 1 else ''}")
    d("")
    d.para(
        f"1-minute load average on the two cores: {r['load'][0]:.1f} before this part, "
        f"{r['load'][1]:.1f} after. Over its {r['contention']['wall_s']:.0f} s, other processes "
        f"used {r['contention']['others_cores']:.2f} of the {os.cpu_count()} cores on average, "
        f"this benchmark (both exporters included) {r['contention']['ours_cores']:.2f}."
    )
    rows: list[list[str]] = []

    def row(label: str, *cells: str) -> None:
        rows.append([label, *cells[: len(cols)]])

    ref_fake = (nv.get("fake_cpu_s", 0.0) / nv["devices_s"] * 100) if nv.get("devices_s") else nan
    row(
        "sampling CPU per GPU per 1 s cycle, on the fake",
        f"{ms(s['collect_ms_per_gpu'])} ms",
        f"{ms(nv.get('devices_ms_per_gpu', nan))} ms",
    )
    row("… of it the fake library's own work", f"{s['fake_share'] * 100:.0f} %", f"{ref_fake:.0f} %")
    row(
        "sampling CPU per GPU per cycle, without the fake",
        f"{ms(s['collect_nofake_ms_per_gpu'])} ms",
        f"{ms(nv.get('devices_nofake_ms_per_gpu', nan))} ms",
    )
    row("NVML calls per GPU per cycle", f"{s['calls_per_gpu']:.1f}", f"{nv.get('calls_per_gpu', nan):.1f}")
    row(
        "other CPU per cycle",
        f"publish {ms(s['publish_ms'])} ms (of it the render of both formats and both gzip "
        f"bodies {ms(s['render_ms'])} ms); node collectors {ms(s['node_ms'])} ms",
        f"host metrics {ms(nv.get('host_s', nan) * 1000)} ms; rendering happens per scrape",
    )
    idle = r["idle_cpu"]
    row(
        f"serving process CPU, nobody scraping ({r['cpu_window_s']:.0f} s window)",
        f"{idle[OURS] * 100:.1f} % of a core",
        f"{idle.get(REF, nan) * 100:.1f} % of a core",
    )
    for mode, label in MODE_LABELS:
        cells = []
        for name in cols:
            lat = r["latency"][name]["one"][mode]
            cells.append(f"{ms(lat.p(50))} / {ms(lat.p(99))} ms, {kb(lat.size)}, n={len(lat.seconds)}")
        row(f"/metrics p50 / p99, one scraper, {label}", *cells)
    cells = []
    for name in cols:
        lat = r["latency"][name]["cycle"]["prometheus"]
        cells.append(f"{ms(lat.p(50))} / {ms(lat.p(100))} ms, n={len(lat.seconds)}")
    row("/metrics median / max, Prometheus' request once per publish cycle", *cells)
    slow = slow_spots(r["latency"][OURS]["cycle"]["prometheus"])
    row(
        "… the slow ones (over twice the median), and where in our cycle they began",
        "; ".join(f"{ms(v)} ms {spot(off)}" for v, off in slow) or "none",
        "not measured",
    )
    hz = r["latency"][OURS]["cycle"]["healthz"]
    row(
        "/healthz median / max after the same pause (the floor of a request after idle)",
        f"{ms(hz.p(50))} / {ms(hz.p(100))} ms, n={len(hz.seconds)}",
        "no such endpoint",
    )
    cells = []
    for name in cols:
        lat = r["latency"][name]["cycle"]["prometheus"]
        cells.append(f"{lat.served}, {kb(lat.size)}")
    row("what Prometheus' request got back", *cells)
    for mode, label in MODE_LABELS:
        cells = []
        for name in cols:
            lat = r["latency"][name]["ten"][mode]
            cells.append(f"{ms(lat.p(50))} / {ms(lat.p(99))} ms, {lat.rate:.0f} req/s, n={len(lat.seconds)}")
        row(f"/metrics p50 / p99, {SCRAPERS} scrapers, {label}", *cells)
    cells = []
    for name in cols:
        st = r["rss_kib"][name]
        cells.append(f"{mb(st['VmHWM']):.1f} MB")
    row("peak RSS (VmHWM) at the end of the run", *cells)
    h = r["history"]
    row(
        f"peak RSS with a full {h['history_seconds']:.0f} s diagnosis history (projected)",
        f"about {mb(projected_rss_kib(r)):.0f} MB ({frames_held(h, h['history_seconds']):.0f} frames "
        f"of {h['kib_per_frame']:.1f} KiB at steady state, "
        f"{frames_held(h, r['ours_running_s']):.0f} of them held when measured)",
        "keeps no history",
    )
    cells = []
    for name in cols:
        st = r["series"][name]
        nan_part = f", {st['gpu_nan_per_gpu']:.0f} of them NaN" if st["gpu_nan_per_gpu"] else ""
        cells.append(
            f"{st['series']} in {st['families']} families; {st['gpu_series_per_gpu']:.0f} per GPU{nan_part}"
        )
    row("series exposed", *cells)
    d.table(["", *cols], rows)


def breakdown_section(d: Doc, by: dict[int, dict[str, Any]]) -> None:
    counts = sorted(by)
    d("## Where our sampling CPU goes")
    d("")
    period = by[counts[0]]["sampling"]["period_runs"]
    d.para(
        "CPU per run of each collector and per 1 s cycle (a collector that runs every 5 s counts a",
        "fifth of a run per cycle), NVML calls per GPU per run, and the fake library's share of the",
        f"run. Runs are averaged over whole periods of {period} runs: the NVLink collector reads link",
        f"state and error counters on one run in {period} and only the byte counters on the others.",
        "The node collectors (engines, allocator) do not grow with the GPU count and are not in the",
        "per-GPU figures.",
    )
    rows = []
    for name in sorted(by[counts[0]]["sampling"]["collectors"]):
        c0 = by[counts[0]]["sampling"]["collectors"][name]
        cells = []
        for n in counts:
            c = by[n]["sampling"]["collectors"][name]
            share = 1.0 / max(1.0, c["interval_s"])
            fake = (min(c["fake_cpu_s"], c["cpu_s"]) / c["cpu_s"] * 100) if c["cpu_s"] else 0.0
            calls = c["fake_calls"] / n
            shown = f"{calls:.0f}" if calls == round(calls) else f"{calls:.1f}"
            cells.append(
                f"{ms(c['cpu_s'] * 1000)} / {ms(c['cpu_s'] * share * 1000)} ms, {shown} calls, {fake:.0f} %"
            )
        kind = "" if c0["nvml"] else " (node)"
        rows.append([f"{name}{kind}", f"{c0['interval_s']:g} s", *cells])
    d.table(
        ["collector", "every", *(f"{n} GPU{'s' if n > 1 else ''}: run / cycle, calls, fake" for n in counts)],
        rows,
    )
    level = by[counts[0]]["sampling"]["gzip_level"]
    d.para(
        "Publishing happens once per cycle whether anyone scrapes or not: compose the snapshot, run",
        "the enrichers, and render: both formats (the text format and OpenMetrics) in one pass over",
        f"the samples, and both gzipped (level {level}). A scrape only picks one of the four cached",
        "bodies. The render, and the gzip part of it, were timed again apart from the publish step,",
        "on the last snapshot.",
    )
    rows = []
    for n in counts:
        s = by[n]["sampling"]
        rows.append(
            [
                str(n),
                f"{ms(s['publish_ms'])} ms",
                f"{ms(s['render_ms'])} ms",
                f"{ms(s['gzip_ms'])} ms",
                f"{ms(s['publish_ms'] - s['render_ms'])} ms",
                f"{kb(s['text_bytes'])} / {kb(s['text_gzip_bytes'])}",
                f"{kb(s['openmetrics_bytes'])} / {kb(s['openmetrics_gzip_bytes'])}",
            ]
        )
    d.table(
        [
            "GPUs",
            "publish",
            "render (both formats, both gzip)",
            "of it gzip",
            "compose + enrichers (the rest)",
            "text body / gzip",
            "OpenMetrics body / gzip",
        ],
        rows,
    )
    micro = by[counts[0]]["sampling"]["micro"]
    d.para(
        f"One NVML call (`nvmlDeviceGetPowerUsage`) costs {micro['pynvml_call_s'] * 1e6:.1f} µs",
        f"through pynvml on the fake; {micro['fake_call_s'] * 1e6:.1f} µs of it is the fake's own",
        "Python function (fault checks, timeline lookup).",
    )


def reference_section(d: Doc, results: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    missing = sorted({sym for r in results for sym in r.get("missing_symbols", [])})
    nan_fams = sorted({f for r in results for f in r["series"][REF]["nan_only_families"]})
    d("## nvitop-exporter on the fake GPUs")
    d("")
    d.para(
        f"nvitop-exporter {meta['versions'].get('nvitop-exporter')} ran unchanged, through its own",
        "console-script entry point; `bench/nvitop_on_fake.py` installs the fake library under pynvml",
        "first. It asked for NVML functions that the fake does not implement; pynvml raised",
        "NVMLError_FunctionNotFound for them and nvitop reported N/A.",
    )
    d("- Functions missing in the fake: " + (", ".join(f"`{x}`" for x in missing) or "none") + ".")
    d(
        "- Its GPU metrics that were N/A (NaN) on every GPU: "
        + (", ".join(f"`{x}`" for x in nan_fams) or "none")
        + "."
    )
    d("")
    d.para(
        "On a real driver it would make those calls too (fan, encoder and decoder, PCIe and NVLink",
        "throughput, power limit), so its sampling figures here are probably a lower bound. Its",
        "exposition is rendered by prometheus_client on every scrape: its idle CPU has no rendering",
        "in it, and its scrape latency grows with the GPU count instead.",
    )


def method_section(d: Doc, meta: dict[str, Any]) -> None:
    plan = plan_of(meta)
    d("## Method")
    d("")
    d(
        "- Scenarios: 1, 8 and 72 H100 80GB SXM GPUs at a steady load (utilization 0.75, NVLink "
        "and PCIe traffic, 90 % memory used), written to a temporary directory. No inference "
        "engine: the engines collector has nothing to scrape, so GPU sampling is what is "
        "measured. Scenario time is real time."
    )
    d(
        "- Sampling CPU (`bench/sampling.py`, a fresh process per GPU count): the exporter is built "
        "by `exporter.app.build` as `serve` builds it (fake library under pynvml, every default "
        "collector, the enrichers), without starting its threads. After 3 warm-up `Runner.step()` "
        "calls, each pass runs every collector once through `Runner.run_collector` and then "
        "`Runner.publish()` (compose, enrichers, render of both formats and both gzip bodies), "
        "with `time.process_time()` around each piece, and every garbage collection timed "
        "through `gc.callbacks`; afterwards the last snapshot is rendered again, and its two "
        "bodies gzipped again, up to 20 times, to time the render and its gzip part alone. "
        f"Passes repeat for {plan.sampling_s:g} s, in whole periods of 10 (the NVLink collector's "
        "state and error counters are read one run in 10). Per-cycle figures weight each "
        "collector by its interval against the 1 s cycle."
    )
    d(
        "- The fake's share (`bench/fakecalls.py`): a whole period of runs (10) of each "
        "collector is recorded at the fake library's entry points (function and ctypes "
        "arguments) and replayed straight on the fake's functions; the replay's CPU, per run, is "
        'what the fake spends, and "without the fake" subtracts it. What remains is the '
        "collectors and pynvml's Python binding, both of which run in production. A real "
        "libnvidia-ml call is C but mostly an ioctl into the driver, not free either: multiply "
        "the NVML calls per GPU per cycle by the driver's per-call cost to complete the picture "
        "on real hardware."
    )
    d(
        "- nvitop-exporter's sampling: the body of its update loop (`update_host`, then "
        "`update_device` for every GPU) timed the same way in-process, with a private registry "
        f"({plan.nvitop_cycles} passes after 3 warm-up passes)."
    )
    d(
        "- Serving: both exporters run as subprocesses on 127.0.0.1 with a 1 s interval: "
        "`python -m exporter.cli serve --scenario-file F --listen 127.0.0.1:PORT --interval 1`, "
        "and `python bench/nvitop_on_fake.py F -- --bind-address 127.0.0.1 --port PORT "
        "--interval 1`. Process CPU (user + system) is read over the same "
        f"{plan.cpu_window_s:g} s wall window with both running and nobody scraping; then the "
        "series of each are counted from one plain scrape, and the latency rounds follow."
    )
    d(
        "- Latency: wall time from sending the request to the last byte of the body as sent "
        "(gzip bodies are not decompressed), with httpx keep-alive clients in the benchmark "
        "process. One scraper: up to "
        f"{plan.sequential} requests per mode. {SCRAPERS} scrapers: threads with a client each, up "
        f"to {plan.concurrent_each} requests each per mode (after one untimed request per client). "
        f"Prometheus' request once per publish cycle: {plan.spaced} requests per exporter, each "
        f"after a {SPACED_GAP_S:g} s pause, so each one meets a newly published cycle, as a real "
        "Prometheus scrape (every 15 s or so) does. After each of ours, an untimed `/readyz` "
        "(it reports the age of the published cycle, on the monotonic clock both processes "
        "share) places the request's start against the end of the nearest publish step; then, "
        "after the same pause, `/healthz` (which does nothing) is timed as the floor of a request "
        "that finds the server idle. "
        f"The work is split into {plan.rounds} rounds; in each round every exporter in turn runs "
        "all its phases while the other one is paused with SIGSTOP; after resuming ours the "
        f"benchmark waits {SETTLE_S:g} s, so that it publishes a whole cycle again. "
        "Interleaving spreads the drift in other people's load over both exporters. "
        f"Each phase of a round also stops after {plan.phase_s / plan.rounds:g} s, so n is the "
        "number of requests actually timed. The scraper threads share one GIL, which adds to "
        "their latencies; the throughput is the sturdier figure there."
    )
    d(
        "- Requests: plain (`Accept-Encoding: identity`; httpx's default `Accept: */*`, so the "
        "text format), gzip (`Accept-Encoding: gzip`: the text format, gzipped), and the "
        "request Prometheus 2.x "
        f"sends (`Accept: {PROMETHEUS_ACCEPT}` and `Accept-Encoding: gzip`). The format and "
        "encoding each exporter answered with are read from the response headers and shown per "
        "GPU count."
    )
    d(
        "- Peak RSS: `VmHWM` from `/proc/PID/status` of each server, read after all its scrapes. "
        "A run serves each GPU count for about a minute, but the diagnosis history spans 900 s "
        "(every frame of the last 120 s, one per 10 s before: about 198 frames at steady state), "
        "so the steady state is projected: `bench/sampling.py --history` builds the exporter in "
        "a fresh process and fills its history to that steady state with scenario time stepped "
        "by hand (10 s per frame for the older part, then 1 s per frame for the last 120 s; "
        "per-second collectors, compose, enrichers; no rendering), within "
        f"{plan.history_s:g} s of wall time. Its VmRSS growth divided by the frames held is the "
        "memory per frame; the projection adds it for the frames the served exporter did not "
        "hold yet (from its unpaused running time, one frame per second)."
    )
    d("- Percentiles are nearest-rank; with n requests, p99 is the ⌈0.99 n⌉-th fastest.")
    d("- MB is 10^6 bytes; KiB is 1024 bytes.")


# ---- main ----------------------------------------------------------------------------------------


def nvitop_available(install: bool) -> tuple[bool, str]:
    if importlib.util.find_spec("nvitop_exporter") is not None:
        return True, "used"
    if not install:
        return False, "it is not installed and --no-install was given (`pip install nvitop-exporter`)."
    log("nvitop-exporter is not installed; installing it with pip")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "nvitop-exporter"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    importlib.invalidate_caches()
    if done.returncode == 0 and importlib.util.find_spec("nvitop_exporter") is not None:
        return True, "used"
    return False, f"`pip install nvitop-exporter` failed: {done.stderr.strip()[-300:]}"


@contextlib.contextmanager
def workdir(keep: bool) -> Iterator[Path]:
    if keep:
        path = Path(tempfile.mkdtemp(prefix="llmgpu-bench-"))
        log(f"keeping scenarios and server logs in {path}")
        yield path
    else:
        with tempfile.TemporaryDirectory(prefix="llmgpu-bench-") as d:
            yield Path(d)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write the Markdown report here (default: stdout)")
    p.add_argument("--json", type=Path, help="also write the raw results as JSON")
    p.add_argument("--quick", action="store_true", help="short loops, for trying the script out")
    p.add_argument("--gpus", default=",".join(map(str, DEFAULT_COUNTS)), help="GPU counts (default 1,8,72)")
    p.add_argument("--no-install", action="store_true", help="do not pip-install a missing nvitop-exporter")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (scenarios, logs)")
    args = p.parse_args(argv)
    plan = QUICK if args.quick else FULL
    counts = [int(x) for x in args.gpus.split(",") if x.strip()]
    started = time.monotonic()
    ok, reason = nvitop_available(not args.no_install)
    if not ok:
        log(f"running without the reference: {reason}")
    load_before = os.getloadavg()[0]
    contention = Contention()
    source = source_state()
    results = []
    with workdir(args.keep) as wd:
        for n in counts:
            results.append(bench_count(n, plan, wd, ok))
    shown = ["python", "bench/run.py"]
    if args.out:
        shown += ["--out", str(args.out)]
    if args.quick:
        shown.append("--quick")
    if args.gpus != ",".join(map(str, DEFAULT_COUNTS)):
        shown += ["--gpus", args.gpus]
    meta = {
        "command": " ".join(shown),
        "quick": args.quick,
        "source": source,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "duration_s": time.monotonic() - started,
        "machine": machine(),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "contention": contention.result(),
        "nvitop": "used" if ok else "absent",
        "nvitop_reason": reason,
        "versions": {
            d: version(d)
            for d in ("nvidia-ml-py", "prometheus-client", "fastapi", "uvicorn", "httpx", "nvitop-exporter")
        },
    }
    text = report(results, meta)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        log(f"wrote {args.out} in {meta['duration_s']:.0f} s")
    else:
        print(text)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, default=_plain, indent=1))
    return 0


def _plain(obj: object) -> object:
    if isinstance(obj, Latency):
        return {
            "p50_ms": obj.p(50),
            "p99_ms": obj.p(99),
            "n": len(obj.seconds),
            "bytes": obj.size,
            "served": obj.served,
            "req_per_s": obj.rate,
            **(
                {"ms_and_offset_s": [[s * 1000, o] for s, o in zip(obj.seconds, obj.offsets, strict=True)]}
                if obj.offsets
                else {}
            ),
        }
    raise TypeError(type(obj).__name__)


if __name__ == "__main__":
    sys.exit(main())
