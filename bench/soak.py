"""A long accelerated soak: does the served exporter grow while the node misbehaves?

    python bench/soak.py [--minutes 120] [--speed 20] [--gpus 8] [--sample-s 30]
                         [--warmup-s 300] [--json OUT.json] [--out OUT.md]

One `llm-gpu-exporter serve --scenario-file` on loopback, a simulated node of A100s
(no GPM, so profiling comes from the simulated dcgm-exporter) with two vLLM engines,
played `--speed` times faster than real time. The scenario repeats a ten-minute pattern
(scenario time) for the whole soak: both engines go down and come back, a GPU falls off
the bus (a different one each time) and one answers errors for a while, an XID arrives,
and the dcgm-exporter goes down, refuses connections, answers slowly, sends garbage and
goes stale; the load swings between two phases so findings fire and clear.

Engines and the dcgm-exporter are scraped every second (`--engine-interval 1`), so that
a fault of a minute of scenario time is seen. Meanwhile a Prometheus-style scraper
(OpenMetrics, gzip, one keep-alive connection) scrapes every `--scrape-s`; a second one
opens a new connection for each scrape, every 7 s, which the server's 5 s idle timeout
closes between scrapes (as it closes a 15 s Prometheus'); the page, the diagnosis JSON,
/readyz, /api/v1/snapshot and /healthz are asked in turn every 2 s. Every
`--sample-s` the server's RSS, open file descriptors and threads are read from /proc.

The report: for each of the three, the slope per hour of a least-squares line through
the samples after `--warmup-s` (the diagnosis history fills, caches warm), with its
standard error, and the means of the first and the last half of those samples; how
many scrapes failed; how many engine restarts, GPU losses and dcgm-exporter faults the
played scenario span held, and how often scrapes saw an engine, a GPU or the
dcgm-exporter down. The simulated engines and dcgm-exporter run in the exporter's
process (they are part of `--scenario-file`), so their memory is in the figures too.

A benchmark, not a test: nothing fails; it says what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
PATTERN_S = 600.0  # scenario seconds of one repetition of the faults
PROMETHEUS = {
    "accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    "accept-encoding": "gzip",
}
BUSY = {
    "util": 0.8, "memory_used_ratio": 0.9, "sm_active": 0.6, "sm_occupancy": 0.4, "tensor_active": 0.4,
    "dram_active": 0.6, "power_ratio": 0.7, "temp_c": 66, "mem_temp_c": 70, "sm_clock_ratio": 0.95,
    "nvlink_tx_bps": 4.0e10, "nvlink_rx_bps": 4.0e10, "pcie_tx_bps": 2.0e8, "pcie_rx_bps": 3.0e8,
}  # fmt: skip
CALM = {**BUSY, "util": 0.3, "sm_active": 0.2, "tensor_active": 0.1, "dram_active": 0.2, "power_ratio": 0.3}
ENGINE_BUSY = {
    "request_rate": 4, "running": 120, "waiting": 30, "kv_usage": 0.97, "preemption_rate": 2,
    "prompt_tps": 8000, "gen_tps": 2500, "ttft_s": 0.8, "itl_s": 0.05, "itl_jitter": 4, "e2e_s": 30,
    "queue_s": 1.0, "api_cpu": 0.6,
}  # fmt: skip
ENGINE_CALM = {
    **ENGINE_BUSY,
    "running": 20,
    "waiting": 0,
    "kv_usage": 0.3,
    "preemption_rate": 0,
    "queue_s": 0,
}


def scenario(gpus: int, scenario_s: float) -> dict[str, Any]:
    """The soak's scenario: the ten-minute pattern of load and faults, repeated to cover
    `scenario_s` seconds."""
    repeats = math.ceil(scenario_s / PATTERN_S) + 1
    phases, faults, dcgm = [], [], []
    half = gpus // 2
    for k in range(repeats):
        t = k * PATTERN_S
        phases += [
            {"name": f"busy-{k}", "duration": PATTERN_S / 2, "ramp": 30, "gpu": BUSY, "engine": ENGINE_BUSY},
            {"name": f"calm-{k}", "duration": PATTERN_S / 2, "ramp": 30, "gpu": CALM, "engine": ENGINE_CALM},
        ]
        faults += [
            {"kind": "engine_down", "engine": "chat", "at": t + 100, "until": t + 140},
            {"kind": "engine_down", "engine": "batch", "at": t + 400, "until": t + 430},
            {"kind": "lost", "gpu": k % gpus, "at": t + 200, "until": t + 260},
            {"kind": "error", "gpu": (k + 1) % gpus, "function": "nvmlDeviceGetPowerUsage", "at": t + 300,
             "until": t + 330},
            {"kind": "xid", "gpu": (k + 2) % gpus, "xid": 13, "at": t + 250, "until": t + 251},
        ]  # fmt: skip
        dcgm += [
            {"kind": "down", "at": t + 20, "until": t + 80},
            {"kind": "refused", "at": t + 140, "until": t + 200},
            {"kind": "slow", "seconds": 5, "at": t + 320, "until": t + 380},
            {"kind": "garbage", "at": t + 440, "until": t + 500},
            {"kind": "stale", "at": t + 520, "until": t + 580},
        ]
    return {
        "name": "soak",
        "description": "bench/soak.py: load swings, engine restarts, GPU losses, a flapping dcgm-exporter",
        "gpus": {"count": gpus, "model": "A100-80GB-SXM"},
        "dcgm_exporter": {"interval": 30, "faults": dcgm},
        "engines": [
            {"name": "chat", "model": "meta-llama/Llama-3.1-70B-Instruct", "gpus": list(range(half))},
            {"name": "batch", "model": "meta-llama/Llama-3.1-8B-Instruct", "gpus": list(range(half, gpus))},
        ],
        "phases": phases,
        "faults": faults,
    }


def played(scn: dict[str, Any], scenario_s: float) -> dict[str, int]:
    """The faults that began within the first `scenario_s` seconds."""

    def count(items: list[dict[str, Any]], **match: Any) -> int:
        return sum(1 for f in items if f["at"] < scenario_s and all(f.get(k) == v for k, v in match.items()))

    dcgm = scn["dcgm_exporter"]["faults"]
    return {
        "engine restarts": count(scn["faults"], kind="engine_down"),
        "GPU losses": count(scn["faults"], kind="lost"),
        "GPU error spells": count(scn["faults"], kind="error"),
        "XIDs": count(scn["faults"], kind="xid"),
        "dcgm-exporter faults": count(dcgm),
    }


# ---- the served process ------------------------------------------------------------------


def proc_state(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"^VmRSS:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
    threads = int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
    return {
        "rss_mib": rss / 1024,
        "fds": float(len(os.listdir(f"/proc/{pid}/fd"))),
        "threads": float(threads),
    }


@dataclass
class Counts:
    scrapes: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    seen_down: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, what: str) -> None:
        with self.lock:
            self.failed += 1
            self.errors[what] = self.errors.get(what, 0) + 1


DOWN = {
    "engine": re.compile(rb"^llmgpu_engine_up\{[^}]*\} 0\.0$", re.M),
    "GPU": re.compile(rb"^llmgpu_gpu_up\{[^}]*\} 0\.0$", re.M),
    "dcgm-exporter": re.compile(rb"^llmgpu_dcgm_exporter_up\{[^}]*\} 0\.0$", re.M),
}


def scraper(url: str, every_s: float, stop: threading.Event, counts: Counts, fresh: bool) -> None:
    """Prometheus' request every `every_s`; `fresh`: a new connection each time."""
    client = httpx.Client(timeout=10.0)
    try:
        while not stop.wait(every_s):
            if fresh:
                client.close()
                client = httpx.Client(timeout=10.0)
            try:
                r = client.get(url, headers=PROMETHEUS)
                ok = r.status_code == 200 and r.content.endswith(b"# EOF\n")
            except httpx.HTTPError as err:
                counts.fail(type(err).__name__)
                continue
            with counts.lock:
                counts.scrapes += 1
            if not ok:
                counts.fail(f"HTTP {r.status_code}")
                continue
            if not fresh:
                for what, pattern in DOWN.items():
                    if pattern.search(r.content):
                        with counts.lock:
                            counts.seen_down[what] = counts.seen_down.get(what, 0) + 1
    finally:
        client.close()


def others(base: str, stop: threading.Event, counts: Counts) -> None:
    """The page, the diagnosis JSON and /healthz, each now and then."""
    with httpx.Client(timeout=10.0) as client:
        n = 0
        while not stop.wait(2.0):
            n += 1
            path = ("/healthz", "/api/v1/diagnosis", "/", "/readyz", "/api/v1/snapshot")[n % 5]
            try:
                r = client.get(base + path)
            except httpx.HTTPError as err:
                counts.fail(f"{path}: {type(err).__name__}")
                continue
            if path == "/healthz" and r.status_code != 200:
                counts.fail(f"/healthz {r.status_code}: {r.text.strip()[:200]}")


# ---- statistics --------------------------------------------------------------------------


def fit(ts: list[float], ys: list[float]) -> dict[str, float]:
    """Least-squares slope per hour with its standard error, and the two half means."""
    n = len(ts)
    mt, my = sum(ts) / n, sum(ys) / n
    sxx = sum((t - mt) ** 2 for t in ts)
    slope = sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / sxx if sxx else 0.0
    resid = [y - (my + slope * (t - mt)) for t, y in zip(ts, ys, strict=True)]
    se = math.sqrt(sum(r * r for r in resid) / (n - 2) / sxx) if n > 2 and sxx else math.nan
    half = n // 2
    first, last = ys[:half], ys[n - half :]
    return {
        "slope_per_h": slope * 3600,
        "stderr_per_h": se * 3600,
        "first_half_mean": sum(first) / len(first) if first else math.nan,
        "last_half_mean": sum(last) / len(last) if last else math.nan,
        "min": min(ys),
        "max": max(ys),
        "n": n,
    }


def report(result: dict[str, Any]) -> str:
    a = result["args"]
    lines = [
        f"Soak: {a['minutes']:.0f} min of wall time at speed {a['speed']:g} ({result['scenario_s']:.0f} s of "
        f"scenario), {a['gpus']} simulated A100s, two engines, a simulated dcgm-exporter; sampled every "
        f"{a['sample_s']:g} s, the first {a['warmup_s']:g} s left out of the fit. "
        f"1-minute load average {result['load'][0]:.2f} at the start, {result['load'][1]:.2f} at the end "
        f"({os.cpu_count()} cores).",
        "",
        "| | slope per hour (± standard error) | first half mean | last half mean | min to max |",
        "|---|---|---|---|---|",
    ]
    units = {"rss_mib": ("RSS", "MiB"), "fds": ("open fds", ""), "threads": ("threads", "")}
    for key, (name, unit) in units.items():
        f = result["fit"][key]
        u = f" {unit}" if unit else ""
        lines.append(
            f"| {name} | {f['slope_per_h']:+.2f}{u}/h (± {f['stderr_per_h']:.2f}) "
            f"| {f['first_half_mean']:.1f}{u} | {f['last_half_mean']:.1f}{u} "
            f"| {f['min']:.1f} to {f['max']:.1f}{u} |"
        )
    c = result["counts"]
    events = ", ".join(f"{v} {k}" for k, v in result["played"].items())
    seen = ", ".join(f"{k} down in {v}" for k, v in c["seen_down"].items()) or "nothing down"
    lines += [
        "",
        f"Scrapes: {c['scrapes']}, failed {c['failed']}" + (f" ({c['errors']})" if c["errors"] else "") + ".",
        f"The played span held {events}; the keep-alive scraper saw {seen} of its scrapes.",
        f"The server exited with {result['exit_code']} on SIGTERM after {result['stop_s']:.1f} s.",
    ]
    return "\n".join(lines) + "\n"


# ---- the run -----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    wall_s = args.minutes * 60
    scn = scenario(args.gpus, wall_s * args.speed + 600)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="llmgpu-soak-") as tmp:
        path = Path(tmp) / "soak.yaml"
        path.write_text(json.dumps(scn))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "exporter.cli", "serve", "--scenario-file", str(path)]
        cmd += ["--speed", str(args.speed), "--listen", f"127.0.0.1:{port}", "--interval", "1"]
        cmd += ["--engine-interval", "1"]  # a fault of a minute of scenario time lasts 3 s here
        with (Path(tmp) / "serve.log").open("wb") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        counts, stop = Counts(), threading.Event()
        samples: list[tuple[float, dict[str, float]]] = []
        threads: list[threading.Thread] = []
        started = time.monotonic()
        try:
            deadline = started + 120
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"serve did not become ready: {(Path(tmp) / 'serve.log').read_text()[-2000:]}"
                    )
                time.sleep(0.5)
            started = time.monotonic()
            for target, targs in (
                (scraper, (base + "/metrics", args.scrape_s, stop, counts, False)),
                (scraper, (base + "/metrics", 7.0, stop, counts, True)),
                (others, (base, stop, counts)),
            ):
                threads.append(threading.Thread(target=target, args=targs, daemon=True))
                threads[-1].start()
            while time.monotonic() - started < wall_s:
                samples.append((time.monotonic() - started, proc_state(proc.pid)))
                if proc.poll() is not None:
                    raise RuntimeError(f"serve exited: {(Path(tmp) / 'serve.log').read_text()[-2000:]}")
                print(
                    f"[soak {time.strftime('%H:%M:%S')}] {samples[-1][0]:.0f} s: {samples[-1][1]}",
                    file=sys.stderr,
                )
                time.sleep(max(0.0, args.sample_s - (time.monotonic() - started - samples[-1][0])))
            samples.append((time.monotonic() - started, proc_state(proc.pid)))
        finally:
            stop.set()
            for t in threads:
                t.join(15)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait(5)
            stop_s = time.monotonic() - t0
    kept = [(t, s) for t, s in samples if t >= args.warmup_s] or samples
    fits = {k: fit([t for t, _ in kept], [s[k] for _, s in kept]) for k in ("rss_mib", "fds", "threads")}
    scenario_s = (samples[-1][0] if samples else 0.0) * args.speed
    return {
        "args": vars(args) | {"json": str(args.json), "out": str(args.out)},
        "scenario_s": scenario_s,
        "load": [load0, os.getloadavg()[0]],
        "samples": samples,
        "fit": fits,
        "played": played(scn, scenario_s),
        "counts": {
            "scrapes": counts.scrapes,
            "failed": counts.failed,
            "errors": counts.errors,
            "seen_down": counts.seen_down,
        },
        "exit_code": code,
        "stop_s": stop_s,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=120.0, help="wall time of the soak (default 120)")
    p.add_argument("--speed", type=float, default=20.0, help="scenario seconds per wall second (default 20)")
    p.add_argument("--gpus", type=int, default=8, help="simulated A100s (default 8)")
    p.add_argument("--sample-s", type=float, default=30.0, help="seconds between samples (default 30)")
    p.add_argument(
        "--scrape-s", type=float, default=1.0, help="seconds between keep-alive scrapes (default 1)"
    )
    p.add_argument("--warmup-s", type=float, default=300.0, help="seconds left out of the fit (default 300)")
    p.add_argument("--json", type=Path, help="write the raw samples and figures here")
    p.add_argument("--out", type=Path, help="write the Markdown summary here (default: stdout)")
    args = p.parse_args(argv)
    result = run(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    text = report(result)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
