"""Real Prometheus and Alertmanager around simulated exporters, all on loopback.

`lab` starts, once per session, thirteen exporters in simulation (accelerated 60x), one
Prometheus that scrapes them every second with the shipped recording rules and the
shipped alert rules (their `for:` shortened), one Alertmanager, and a webhook receiver
in this process. Two clusters share the Prometheus, told apart by a target label the way
relabelling would set it:

- `fleet`: six nodes, four healthy, one saturated (sm-saturation), one leaking memory
  (memory-leak): the fleet dashboard and recording rules must single out the last two;
- `lab`: one node for each other scenario, and one healthy node a test stops.

`lab2` runs the remaining scenarios (one node each, no Alertmanager) once `lab` has
stopped: twenty-one exporters at once would be too many for two cores.

Every wait is bounded; every process is killed when the session ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
RULE_FILES = sorted((ROOT / "alerts").glob("*.rules.yml"))
SPEED = 60  # scenario seconds per wall second: a 10-minute scenario plays in 10 s
# gpu-lost's XID 79 comes at scenario second 119: 2 s of wall time at 60x, often before
# Prometheus' first scrape of a just-started exporter, and increase() needs a sample
# before the event. At 10x it comes 12 s in. ecc-errors' bad row counts from scenario
# second 180 (3 s at 60x, read every 5 s of wall time by the ECC collector): at 20x
# from 9 s to 12 s, its last phase still begun within the lab's 14 s.
SPEEDS = {"gpu-lost": 10, "ecc-errors": 20}
JOB = "llm-gpu-exporter"

# node name -> (cluster, scenario)
FLEET = {
    "node-1": "healthy",
    "node-2": "healthy",
    "node-3": "healthy",
    "node-4": "healthy",
    "node-5": "sm-saturation",
    "node-6": "memory-leak",
}
LAB = {
    "lab-decode": "decode-memory-bound",
    "lab-kv": "kv-pressure",
    "lab-thermal": "thermal-throttle",
    "lab-nvlink": "nvlink-imbalance",
    "lab-lost": "gpu-lost",
    "lab-mig": "mig",
    "lab-doomed": "healthy",  # stopped by a test: LlmGpuExporterDown must page
}
UNHEALTHY_FLEET_NODES = ("node-5", "node-6")
# Every other scenario, in a second lab that runs after the first.
LAB2 = {
    f"more-{s}": s
    for s in (
        "ecc-errors",
        "fp32-fallback",
        "oom-crash",
        "pcie-tensor-parallel",
        "power-capped",
        "scheduler-bound",
        "small-batches",
        "spec-decode",
        "pd-prefill-bound",
        "pd-kv-transfer-slow",
    )
}

T = TypeVar("T")


# ---- small tools -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.25) -> T:
    """Call `check` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = check()
        except (OSError, ValueError, KeyError) as err:  # not up yet
            last_error = err
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    raise TimeoutError(f"gave up after {timeout:.0f} s waiting for {what} (last error: {last_error})")


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


@dataclass
class Proc:
    """A child process with its output in a log file; `stop` ends it and its children."""

    name: str
    args: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        handle = self.log.open("wb")
        self.popen = subprocess.Popen(
            self.args, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )
        handle.close()
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=5)


# ---- Prometheus HTTP API -------------------------------------------------------------------


@dataclass
class Prom:
    url: str

    def _api(self, path: str, **params: str | float) -> Any:
        query = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
        try:
            body = http_get(f"{self.url}/api/v1/{path}?{query}", timeout=20)
        except urllib.error.HTTPError as err:
            body = err.read()
        data = json.loads(body)
        if data.get("status") != "success":
            raise PromQLError(f"{data.get('errorType')}: {data.get('error')}")
        return data["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, str | float] = {"query": expr}
        if at is not None:
            params["time"] = at
        result = self._api("query", **params)["result"]
        return result if isinstance(result, list) else [result]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        return self._api("query_range", query=expr, start=start, end=end, step=step)["result"]

    def label_values(self, label: str, match: str) -> list[str]:
        return self._api(f"label/{label}/values", **{"match[]": match})

    def targets_up(self) -> int:
        return len(self.query(f'up{{job="{JOB}"}} == 1'))

    def alerts(self) -> list[dict[str, Any]]:
        return self._api("alerts")["alerts"]

    def rule_health(self) -> list[tuple[str, str, str]]:
        """(rule name, health, last error) of every rule Prometheus evaluates."""
        out = []
        for group in self._api("rules")["groups"]:
            for rule in group["rules"]:
                out.append((rule["name"], rule["health"], rule.get("lastError", "")))
        return out


class PromQLError(Exception):
    pass


# ---- webhook receiver ----------------------------------------------------------------------


class Webhook:
    """Alertmanager's webhook receiver: keeps every notification it is sent."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                payload = json.loads(self.rfile.read(length) or b"{}")
                with outer.lock:
                    outer.notifications.append(payload)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/page"
        self.thread = threading.Thread(target=self.server.serve_forever, name="webhook", daemon=True)
        self.thread.start()

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert of every notification, in arrival order."""
        with self.lock:
            return [a for n in self.notifications for a in n.get("alerts", [])]

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()


# ---- configuration files -------------------------------------------------------------------


def shortened(rule_file: Path, out: Path, for_: str = "2s") -> Path:
    """The rule file with every alert's `for:` cut to `for_` (the semantics of the shipped
    durations are the unit tests' business; here the pipeline is)."""
    data = yaml.safe_load(rule_file.read_text())
    for group in data["groups"]:
        for rule in group["rules"]:
            if "alert" in rule and "for" in rule:
                rule["for"] = for_
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def prometheus_config(
    nodes: dict[str, tuple[str, str, int]], rules: list[Path], alertmanager: int | None
) -> str:
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rules],
        "scrape_configs": [
            {
                "job_name": JOB,
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{port}"],
                        # what the Helm chart's relabelling sets: the cluster and node names
                        "labels": {"cluster": cluster, "node": node, "scenario": scenario},
                    }
                    for node, (cluster, scenario, port) in nodes.items()
                ],
            }
        ],
    }
    if alertmanager is not None:
        config["alerting"] = {
            "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager}"]}]}]
        }
    return yaml.safe_dump(config, sort_keys=False)


def alertmanager_config(webhook: str) -> str:
    return yaml.safe_dump(
        {
            "route": {
                "receiver": "page",
                "group_by": ["alertname", "instance"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [{"name": "page", "webhook_configs": [{"url": webhook, "send_resolved": False}]}],
        },
        sort_keys=False,
    )


# ---- the lab -------------------------------------------------------------------------------


@dataclass
class Lab:
    prom: Prom
    alertmanager_url: str
    webhook: Webhook
    nodes: dict[str, tuple[str, str, int]]  # node -> (cluster, scenario, port)
    started: float  # wall clock when the exporters were up
    procs: list[Proc] = field(default_factory=list)
    exporters: dict[str, Proc] = field(default_factory=dict)
    rule_dir: Path | None = None
    ready: float = 0.0  # wall clock when Prometheus had scraped every exporter

    def instance(self, node: str) -> str:
        return f"127.0.0.1:{self.nodes[node][2]}"

    def node_of(self, scenario: str) -> str:
        """The node that runs `scenario` (node-1 for healthy)."""
        return next(n for n, (_, s, _) in self.nodes.items() if s == scenario)

    def cluster_of(self, node: str) -> str:
        return self.nodes[node][0]

    def logs(self) -> str:
        return "\n\n".join(f"--- {p.name} ---\n{p.tail()}" for p in self.procs if not p.alive())

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.webhook.stop()


_OPEN: dict[str, Lab] = {}  # fixture name -> lab still running
LAB_FIXTURES = ("lab", "lab2")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tests of one lab together, `lab` first, so each lab can stop as soon as its
    last test is done (see pytest_runtest_teardown). Only this directory's tests move."""
    here = Path(__file__).parent

    def rank(item: pytest.Item) -> int:
        names = getattr(item, "fixturenames", ())
        return next((i for i, f in enumerate(LAB_FIXTURES) if f in names), len(LAB_FIXTURES))

    slots = [i for i, item in enumerate(items) if Path(str(item.fspath)).parent == here]
    for slot, item in zip(slots, sorted((items[i] for i in slots), key=rank), strict=True):
        items[slot] = item


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop a lab after the last test that uses it: a dozen exporters are not left running
    (on two cores) through the tests that come after."""
    if not _OPEN:
        return
    items = item.session.items
    later = items[items.index(item) + 1 :] if item in items else []
    for name in list(_OPEN):
        if not any(name in getattr(i, "fixturenames", ()) for i in later):
            _OPEN.pop(name).close()


def _start_exporter(node: str, scenario: str, port: int, logs: Path) -> Proc:
    args = [
        sys.executable, "-m", "exporter.cli", "serve",
        "--simulate", scenario,
        "--speed", str(SPEEDS.get(scenario, SPEED)),
        "--interval", "0.5",
        "--listen", f"127.0.0.1:{port}",
    ]  # fmt: skip
    return Proc(f"exporter {node} ({scenario})", args, logs / f"exporter-{node}.log").start()


@contextlib.contextmanager
def running_lab(tmp: Path, clusters: dict[str, dict[str, str]], alertmanager: bool) -> Iterator[Lab]:
    """Exporters for {cluster: {node: scenario}}, a Prometheus scraping them with the
    shipped rules (`for:` shortened) and, if asked, an Alertmanager paging the webhook."""
    if PROMETHEUS is None or (alertmanager and ALERTMANAGER is None):
        pytest.skip("prometheus and prometheus-alertmanager are needed")
    procs: list[Proc] = []
    webhook = Webhook()
    try:
        nodes = {n: (c, s, free_port()) for c, members in clusters.items() for n, s in members.items()}
        exporters = {}
        for node, (_, scenario, port) in nodes.items():
            exporters[node] = _start_exporter(node, scenario, port, tmp)
            procs.append(exporters[node])

        am_port = None
        if alertmanager:
            assert ALERTMANAGER is not None
            am_port = free_port()
            (tmp / "alertmanager.yml").write_text(alertmanager_config(webhook.url))
            am_args = [
                ALERTMANAGER,
                f"--config.file={tmp / 'alertmanager.yml'}",
                f"--storage.path={tmp / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ]
            procs.append(Proc("alertmanager", am_args, tmp / "alertmanager.log").start())

        rules_dir = tmp / "rules"
        rules_dir.mkdir()
        rules = [shortened(p, rules_dir / p.name) for p in RULE_FILES]
        prom_port = free_port()
        (tmp / "prometheus.yml").write_text(prometheus_config(nodes, rules, am_port))
        prom_args = [
            PROMETHEUS,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--log.level=warn",
        ]
        procs.append(Proc("prometheus", prom_args, tmp / "prometheus.log").start())

        def exporters_up() -> bool:
            for node, (_, _, port) in nodes.items():
                if b"llmgpu_gpu_up" not in http_get(f"http://127.0.0.1:{port}/metrics"):
                    raise ValueError(f"{node} not ready")
            return True

        prom = Prom(f"http://127.0.0.1:{prom_port}")
        am_url = f"http://127.0.0.1:{am_port}" if am_port else ""
        lab = Lab(prom, am_url, webhook, nodes, time.time(), procs, exporters, rules_dir)
        try:
            wait_until(exporters_up, 60, "the exporters to serve /metrics")
            lab.started = time.time()
            wait_until(lambda: http_get(f"{prom.url}/-/ready"), 30, "Prometheus to be ready")
            if am_url:
                wait_until(lambda: http_get(f"{am_url}/-/ready"), 30, "Alertmanager to be ready")
            wait_until(lambda: prom.targets_up() == len(nodes), 30, "Prometheus to scrape every exporter")
            lab.ready = time.time()
        except TimeoutError as err:
            raise RuntimeError(f"{err}\n{lab.logs()}") from None
        yield lab
    finally:
        for proc in reversed(procs):
            proc.stop()
        webhook.stop()


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """The fleet, one node per scenario the issue names, Alertmanager and the webhook."""
    with running_lab(tmp_path_factory.mktemp("lab"), {"fleet": FLEET, "lab": LAB}, alertmanager=True) as lab:
        _OPEN["lab"] = lab
        yield lab
        _OPEN.pop("lab", None)


@pytest.fixture(scope="session")
def lab2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One node for each remaining scenario, started after `lab` has stopped."""
    with running_lab(tmp_path_factory.mktemp("lab2"), {"lab2": LAB2}, alertmanager=False) as lab:
        _OPEN["lab2"] = lab
        yield lab
        _OPEN.pop("lab2", None)


def expand(expr: str, values: dict[str, str]) -> str:
    """A dashboard query with its Grafana variables filled in as Grafana would."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)
