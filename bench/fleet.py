"""What a fleet of these exporters costs a real Prometheus, per metric profile.

    python bench/fleet.py [--nodes 16] [--profiles default,full] [--settle 75] [--window 60]
                          [--json FILE]

For each profile: one child process builds the exporter once on the `healthy` scenario
(8 simulated H100s and their vLLM engines, sampled every second as `serve` does) and
serves it with the real HTTP app (`exporter.web.server.create_app`) on `--nodes` ports, so
each simulated node is a target of its own with its own `instance` and `node` labels
while the sampling is paid once (2 shared cores). Prometheus (Debian's 2.42) scrapes
every target every 15 s and evaluates the shipped rules (alerts/*.rules.yml) every 15 s.
After `--settle` seconds the benchmark reads, from Prometheus' own /metrics:
`prometheus_tsdb_head_series`, the samples appended per second over `--window`
seconds (`prometheus_tsdb_head_samples_appended_total`), the resident memory
(`process_resident_memory_bytes`) and every rule group's
`prometheus_rule_group_last_duration_seconds` (the largest seen in the window); then it
times every query of the fleet dashboard (dashboards/fleet.dashboard.py, `cluster` set
to the fleet's) as an instant query and as a 1-hour range query at a 15 s step, five
times each. Prints one JSON object; a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from harness import ROOT, free_port

SCRAPE_S = 15
CLUSTER = "fleet"
JOB = "llm-gpu-exporter"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


# ---- the child: one exporter served on N ports ------------------------------------------------


def serve_nodes(ports: list[int], profile: str) -> None:
    import uvicorn

    sys.path.insert(0, str(ROOT))
    from exporter import app
    from exporter.config import Settings
    from exporter.web.server import create_app

    exporter = app.build(Settings(simulate="healthy", speed=1.0, interval=1.0, metric_profile=profile))
    exporter.runner.start()
    servers = [
        uvicorn.Server(
            uvicorn.Config(
                create_app(exporter.runner), host="127.0.0.1", port=p, log_level="warning", access_log=False
            )
        )
        for p in ports
    ]
    for s in servers:
        s.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    async def run() -> None:
        tasks = [asyncio.create_task(s.serve()) for s in servers]
        while not stop.is_set():
            await asyncio.sleep(0.2)
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks)

    try:
        asyncio.run(run())
    finally:
        exporter.close()


# ---- the parent: Prometheus and the measurements ------------------------------------------------


def prometheus_config(ports: list[int], rules: list[Path]) -> str:
    return yaml.safe_dump(
        {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
            "rule_files": [str(p) for p in rules],
            "scrape_configs": [
                {
                    "job_name": JOB,
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{port}"],
                            "labels": {"cluster": CLUSTER, "node": f"node-{i}"},
                        }
                        for i, port in enumerate(ports, 1)
                    ],
                }
            ],
        },
        sort_keys=False,
    )


def own_metrics(client: httpx.Client, url: str) -> dict[str, list[tuple[str, float]]]:
    out: dict[str, list[tuple[str, float]]] = {}
    for line in client.get(f"{url}/metrics").text.splitlines():
        m = SAMPLE.match(line)
        if m and not line.startswith("#"):
            out.setdefault(m.group(1), []).append((m.group(2) or "", float(m.group(3))))
    return out


def one(metrics: dict[str, list[tuple[str, float]]], name: str) -> float:
    return sum(v for _, v in metrics.get(name, ()))


def fleet_queries() -> list[tuple[str, str]]:
    sys.path.insert(0, str(ROOT))
    from dashboards import generate
    from dashboards.common import queries

    board = next(b for p, b in generate.boards().items() if p.name == "fleet.dashboard.py")
    return [(title, q.expr.replace("$cluster", CLUSTER)) for title, q in queries(board)]


def time_queries(client: httpx.Client, url: str) -> dict[str, Any]:
    now = time.time()
    per: list[dict[str, Any]] = []
    for title, expr in fleet_queries():
        instant, ranged = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            r = client.get(f"{url}/api/v1/query", params={"query": expr, "time": now})
            instant.append(time.perf_counter() - t0)
            r.raise_for_status()
            t0 = time.perf_counter()
            r = client.get(
                f"{url}/api/v1/query_range",
                params={"query": expr, "start": now - 3600, "end": now, "step": SCRAPE_S},
            )
            ranged.append(time.perf_counter() - t0)
            r.raise_for_status()
        per.append(
            {
                "panel": title,
                "instant_ms": statistics.median(instant) * 1000,
                "range_1h_ms": statistics.median(ranged) * 1000,
                "series": len(r.json()["data"]["result"]),
            }
        )
    return {
        "queries": len(per),
        "instant_total_ms": sum(p["instant_ms"] for p in per),
        "range_total_ms": sum(p["range_1h_ms"] for p in per),
        "slowest": max(per, key=lambda p: p["range_1h_ms"]),
        "per_query": per,
    }


def exporter_series(client: httpx.Client, port: int) -> dict[str, float]:
    """Series one node exposes, and those carrying a GPU's uuid, per GPU."""
    text = client.get(f"http://127.0.0.1:{port}/metrics").text
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    gpu = [ln for ln in lines if 'uuid="GPU-' in ln.split(" ")[0]]
    return {"series_per_node": len(lines), "gpu_series_per_gpu": len(gpu) / 8}


def measure(profile: str, nodes: int, settle_s: float, window_s: float, tmp: Path) -> dict[str, Any]:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise SystemExit("prometheus is missing (Debian package prometheus)")
    ports = [free_port() for _ in range(nodes)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    child_log = (tmp / f"nodes-{profile}.log").open("wb")
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", ",".join(map(str, ports)), "--profiles", profile],
        cwd=ROOT,
        env=env,
        stdout=child_log,
        stderr=subprocess.STDOUT,
    )
    data = tmp / f"prom-{profile}"
    config = tmp / f"prometheus-{profile}.yml"
    config.write_text(prometheus_config(ports, sorted((ROOT / "alerts").glob("*.rules.yml"))))
    prom_port = free_port()
    url = f"http://127.0.0.1:{prom_port}"
    prom_log = (tmp / f"prometheus-{profile}.log").open("wb")
    prom = None
    try:
        with httpx.Client(timeout=30.0) as client:
            deadline = time.monotonic() + 90
            while True:
                try:
                    if client.get(f"http://127.0.0.1:{ports[-1]}/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or child.poll() is not None:
                    raise RuntimeError((tmp / f"nodes-{profile}.log").read_text()[-2000:])
                time.sleep(0.5)
            node = exporter_series(client, ports[0])
            prom = subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={data}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                    "--log.level=warn",
                ],
                stdout=prom_log,
                stderr=subprocess.STDOUT,
            )
            started = time.monotonic()
            time.sleep(settle_s)
            first = own_metrics(client, url)
            t0 = time.monotonic()
            durations: dict[str, float] = {}
            while time.monotonic() < t0 + window_s:
                groups = own_metrics(client, url).get("prometheus_rule_group_last_duration_seconds", ())
                for labels, v in groups:
                    group = re.search(r'rule_group="[^"]*;([^"]+)"', labels)
                    key = group.group(1) if group else labels
                    durations[key] = max(durations.get(key, 0.0), v)
                time.sleep(SCRAPE_S / 3)
            last = own_metrics(client, url)
            elapsed = time.monotonic() - t0
            appended = one(last, "prometheus_tsdb_head_samples_appended_total") - one(
                first, "prometheus_tsdb_head_samples_appended_total"
            )
            up = client.get(f"{url}/api/v1/query", params={"query": f'count(up{{job="{JOB}"}} == 1)'})
            queries = time_queries(client, url)
            return {
                "profile": profile,
                "nodes": nodes,
                "gpus": nodes * 8,
                "targets_up": float(up.json()["data"]["result"][0]["value"][1]),
                "ran_s": time.monotonic() - started,
                "exporter": node,
                "head_series": one(last, "prometheus_tsdb_head_series"),
                "samples_per_second": appended / elapsed,
                "rss_bytes": one(last, "process_resident_memory_bytes"),
                "rule_group_seconds": durations,
                "rule_seconds_total": sum(durations.values()),
                "fleet_dashboard": queries,
            }
    finally:
        for proc in (prom, child):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
        child_log.close()
        prom_log.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--profiles", default="default,full")
    p.add_argument("--settle", type=float, default=75.0, help="seconds of scraping before measuring")
    p.add_argument("--window", type=float, default=60.0, help="seconds over which samples/s are counted")
    p.add_argument("--json", type=Path)
    p.add_argument("--serve", help=argparse.SUPPRESS)  # the child: ports to serve on
    args = p.parse_args()
    if args.serve:
        serve_nodes([int(x) for x in args.serve.split(",")], args.profiles)
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="llmgpu-fleet-") as tmp:
        for profile in args.profiles.split(","):
            results.append(measure(profile, args.nodes, args.settle, args.window, Path(tmp)))
    out = {"loadavg": os.getloadavg(), "results": results}
    text = json.dumps(out, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
