"""The measurement harness: scenarios, served exporters, scrapers and contention, to a plain results dict."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from settings import MODES, OURS, SCRAPERS, SETTLE_S, SPACED_GAP_S, Plan

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
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
    args += ["--speed", "1"]  # real time, as on a node: a simulation samples per scenario second
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

    def summary(self) -> dict[str, Any]:
        """What the report reads: percentiles, count, body, throughput and, where there
        are offsets, every request's time with where in our cycle it began."""
        return {
            "p50_ms": self.p(50),
            "p99_ms": self.p(99),
            "max_ms": self.p(100),
            "n": len(self.seconds),
            "bytes": self.size,
            "served": self.served,
            "req_per_s": self.rate,
            **(
                {"ms_and_offset_s": [[s * 1000, o] for s, o in zip(self.seconds, self.offsets, strict=True)]}
                if self.offsets
                else {}
            ),
        }


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


def latencies(servers: Sequence[Server], plan: Plan, gpus: int) -> dict[str, dict[str, dict[str, Any]]]:
    """Every exporter, mode and concurrency, interleaved in rounds, each as `Latency.summary()`.

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
    return {
        name: {k: {m: lat.summary() for m, lat in v.items()} for k, v in kinds.items()}
        for name, kinds in out.items()
    }


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


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
