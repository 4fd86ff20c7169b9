"""Idle CPU and Prometheus-style scrape latency of the serving process: this tree against
the exporter at a git ref, in one run.

    python bench/idle.py [--old-ref REF] [--gpus 8] [--cpu-window 60] [--pairs 60]
                         [--scrape-period 2] [--json FILE]

Both exporters serve the same steady-load H100 scenario (harness.write_scenario) with
`serve --interval 1`, each its own process: the old one from `git archive REF exporter`
unpacked in a temporary directory, the new one from this tree.

- Idle CPU: each is measured for `--cpu-window` seconds in all, in rounds during which
  the other one is stopped with SIGSTOP, while it is scraped as Prometheus does, every
  15 s (its Accept header, gzip); the process' user + system CPU over its windows, per
  second of wall time, is its share of one core. Where the exporter reports it (the
  simulation block of /api/v1/diagnosis), the CPU its fake NVML library spent answering
  calls in those windows is reported too, and the share without it: the Python that
  stands in for libnvidia-ml's C.
- Latency: `--pairs` pairs of requests per exporter, scraped as Prometheus scrapes: a
  Prometheus-style /metrics request every `--scrape-period` seconds on a fixed phase
  (so every scrape meets a snapshot no one has scraped yet, and a scrape cadence can be
  learnt), and halfway between two scrapes /healthz (which does nothing), the floor of a
  request that finds the server idle. The pairs are split into rounds; in each round
  one exporter runs while the other is stopped with SIGSTOP, and after resuming an
  exporter the benchmark waits 1.5 s for it to publish again. Each round begins with
  LEARN untimed scrapes on the same cadence: the steady state of a scraper that has been
  scraping for a while, which is what a Prometheus scrape meets.

Prints one JSON object; a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

import httpx
from harness import ROOT, Server, free_port, wait_ready, write_scenario
from settings import PROMETHEUS_ACCEPT

SCRAPE_EVERY_S = 15.0
ROUNDS = 4
SETTLE_S = 1.5
LEARN = 3  # scrapes before the timed ones in each round, as a scraper running for a while has made
PROMETHEUS = {"accept": PROMETHEUS_ACCEPT, "accept-encoding": "gzip"}


def unpack(ref: str, into: Path) -> str:
    """The exporter package at `ref`, unpacked under `into`; returns the commit."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "archive", commit, "exporter"], cwd=ROOT, capture_output=True, check=True
    )
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return commit


def serve(name: str, root: Path, scenario: Path, logdir: Path) -> Server:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONUNBUFFERED="1")
    args = ["-m", "exporter.cli", "serve", "--scenario-file", str(scenario)]
    args += ["--listen", f"127.0.0.1:{port}", "--interval", "1"]
    args += ["--speed", "1"]  # real time, as on a node: a simulation samples per scenario second
    log = logdir / f"{name}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=root, env=env, stdout=sink, stderr=subprocess.STDOUT
        )
    # Server's name decides how wait_ready checks readiness: both are ours.
    return Server("llm-gpu-exporter", proc, port, log)


def timed(client: httpx.Client, url: str, headers: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    response = client.get(url, headers=headers)
    took = time.perf_counter() - t0
    response.raise_for_status()
    return took, len(response.content)


def percentile(values: list[float], q: float) -> float:
    ranked = sorted(values)
    return ranked[max(0, min(len(ranked) - 1, int(-(-q * len(ranked) // 1)) - 1))]


def summary(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {"n": len(ms), "p50_ms": percentile(ms, 0.5), "p99_ms": percentile(ms, 0.99), "max_ms": max(ms)}


def library_cpu(client: httpx.Client, server: Server) -> float | None:
    """CPU the simulator's fake NVML library has spent in the exporter so far, as its
    latest snapshot says; None for an exporter that does not count it."""
    url = server.url.replace("/metrics", "/api/v1/diagnosis")
    value = client.get(url).json().get("simulation", {}).get("library_cpu_seconds")
    return None if value is None else float(value)


def idle_cpu(servers: dict[str, Server], window_s: float) -> dict[str, dict[str, float | None]]:
    cpu = dict.fromkeys(servers, 0.0)
    lib: dict[str, float | None] = dict.fromkeys(servers, 0.0)
    wall = dict.fromkeys(servers, 0.0)
    scrapes = dict.fromkeys(servers, 0)
    for _ in range(ROUNDS):
        for name, server in servers.items():
            others = [s for n, s in servers.items() if n != name]
            for other in others:
                other.pause()
            try:
                time.sleep(SETTLE_S)
                with httpx.Client(timeout=10.0) as client:
                    # the library's count is asked outside the window: the JSON is not idle work
                    lib0 = library_cpu(client, server)
                    cpu0, started = server.cpu_seconds(), time.monotonic()
                    next_at = started
                    while (now := time.monotonic()) < started + window_s / ROUNDS:
                        if now >= next_at:
                            timed(client, server.url, PROMETHEUS)
                            scrapes[name] += 1
                            next_at += SCRAPE_EVERY_S
                        time.sleep(0.05)
                    wall[name] += time.monotonic() - started
                    cpu[name] += server.cpu_seconds() - cpu0
                    lib1 = library_cpu(client, server)
                    spent, seen = lib[name], (lib1 - lib0 if lib0 is not None and lib1 is not None else None)
                    lib[name] = None if spent is None or seen is None else spent + seen
            finally:
                for other in others:
                    other.resume()
    out: dict[str, dict[str, float | None]] = {}
    for n in servers:
        spent = lib[n]
        out[n] = {
            "window_s": wall[n],
            "cpu_s": cpu[n],
            "core_ratio": cpu[n] / wall[n],
            "library_cpu_s": spent,
            "core_ratio_without_library": None if spent is None else (cpu[n] - spent) / wall[n],
            "scrapes": scrapes[n],
        }
    return out


def latency(servers: dict[str, Server], pairs: int, period: float) -> dict[str, Any]:
    samples: dict[str, dict[str, list[float]]] = {n: {"scrape": [], "healthz": []} for n in servers}
    size: dict[str, int] = {}
    for round_ in range(ROUNDS):
        for name, server in servers.items():
            others = [s for n, s in servers.items() if n != name]
            for other in others:
                other.pause()
            try:
                with httpx.Client(timeout=10.0) as client:
                    client.get(server.healthz)  # the connection, kept alive as Prometheus does
                    due = time.monotonic() + period
                    for _ in range(LEARN):  # untimed: what a cadence is learnt from
                        time.sleep(max(0.0, due - time.monotonic()))
                        timed(client, server.url, PROMETHEUS)
                        due += period
                    for _ in range(pairs // ROUNDS + (round_ < pairs % ROUNDS)):
                        time.sleep(max(0.0, due - time.monotonic()))
                        took, size[name] = timed(client, server.url, PROMETHEUS)
                        samples[name]["scrape"].append(took)
                        time.sleep(max(0.0, due + period / 2 - time.monotonic()))
                        samples[name]["healthz"].append(timed(client, server.healthz, {})[0])
                        due += period
            finally:
                for other in others:
                    other.resume()
            time.sleep(SETTLE_S)
    out: dict[str, Any] = {}
    for name, kinds in samples.items():
        scrape, floor = summary(kinds["scrape"]), summary(kinds["healthz"])
        out[name] = {
            "scrape": scrape,
            "healthz": floor,
            "p99_over_floor": scrape["p99_ms"] / floor["p99_ms"],
            "p50_over_floor": scrape["p50_ms"] / floor["p50_ms"],
            "body_bytes": size[name],  # as decompressed
        }
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--old-ref",
        help="git ref of the exporter to compare with (default: where this branch left main)",
    )
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--cpu-window", type=float, default=60.0, help="seconds of idle CPU measurement")
    p.add_argument("--pairs", type=int, default=60, help="scrape + healthz pairs per exporter")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument(
        "--scrape-period", type=float, default=2.0, help="seconds between two scrapes in the latency phase"
    )
    args = p.parse_args()

    if args.old_ref is None:
        args.old_ref = subprocess.run(
            ["git", "merge-base", "HEAD", "main"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()[:7]
    with tempfile.TemporaryDirectory(prefix="llmgpu-idle-") as tmp_name:
        tmp = Path(tmp_name)
        old_root = tmp / "old"
        old_root.mkdir()
        commit = unpack(args.old_ref, old_root)
        new_commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "exporter"], cwd=ROOT, capture_output=True)
        scenario = write_scenario(tmp, args.gpus)
        servers = {
            f"old ({commit})": serve("old", old_root, scenario, tmp),
            f"new ({new_commit}{'+' if dirty.stdout else ''})": serve("new", ROOT, scenario, tmp),
        }
        try:
            for server in servers.values():
                wait_ready(server, args.gpus)
            time.sleep(10.0)  # a few cycles and the first GPM pair before measuring
            results = {
                "gpus": args.gpus,
                "scrape_every_s": SCRAPE_EVERY_S,
                "latency_scrape_period_s": args.scrape_period,
                "idle": idle_cpu(servers, args.cpu_window),
                "latency": latency(servers, args.pairs, args.scrape_period),
                "loadavg": os.getloadavg(),
            }
        finally:
            for server in servers.values():
                server.stop()
    text = json.dumps(results, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
