"""Abusive clients against the served exporter, before and after the server limits.

    python bench/hardening.py --before REF [--gpus 8 72] [--non-readers 1000] [--idle 20000]

For each GPU count and each version (the tree at REF, extracted with `git archive`, then
this checkout), starts `llm-gpu-exporter serve` on a simulated node on loopback and:

1. scrapes it as Prometheus does (OpenMetrics, gzip) and reads its RSS, idle;
2. opens `--non-readers` connections that each send `GET /metrics` (the plain text
   body, the largest) and never read, with a 4 KiB receive buffer; after a pause,
   reads the server's RSS and times normal scrapes;
3. opens `--idle` connections that send nothing (from child processes: one process may
   open 20 000 files here) and times a normal scrape.

Every loop is bounded and every socket is closed at the end; nothing leaves loopback.
Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = {
    "accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    "accept-encoding": "gzip",
}
SCENARIO = (
    "gpus: {{count: {n}, model: H100-80GB-SXM}}\nphases: [{{name: p, duration: 36000, gpu: {{util: 0.5}}}}]\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def scrape(url: str, timeout: float = 10.0) -> float | None:
    """Seconds for one Prometheus-style scrape; None when it timed out or failed."""
    with httpx.Client(timeout=timeout) as client:  # made before the clock starts
        started = time.perf_counter()
        try:
            client.get(url, headers=PROMETHEUS).raise_for_status()
        except httpx.HTTPError:
            return None
        return time.perf_counter() - started


def show(seconds: float | None) -> str:
    return "failed (10 s timeout)" if seconds is None else f"{seconds * 1000:.0f} ms"


@contextlib.contextmanager
def served(src: Path, scenario: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    cmd = [sys.executable, "-m", "exporter.cli", "serve", "--scenario-file", str(scenario)]
    cmd += ["--listen", f"127.0.0.1:{port}", "--no-discover-processes"]
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{src}: not ready in 90 s")
        time.sleep(3)  # a few cycles: steady state
        yield proc, base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _reset_on_close(s: socket.socket) -> None:
    # RST instead of FIN: no TIME_WAIT, so the next phase has its ports back
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def non_readers(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        _reset_on_close(s)
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nhost: bench\r\naccept-encoding: identity\r\n\r\n")
        except OSError:
            s.close()
            continue
        socks.append(s)
    return socks


def idle_connections(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.socket()
        _reset_on_close(s)
        s.setblocking(False)
        if s.connect_ex(("127.0.0.1", port)) not in (0, 115):  # 115: EINPROGRESS
            s.close()
            continue
        socks.append(s)
    return socks


def _opened(socks: list[socket.socket], asked: int) -> str:
    return "" if len(socks) == asked else f" ({len(socks)} connected)"


HOLD_PER_PROCESS = 15000  # under this machine's 20 000 open files per process


@contextlib.contextmanager
def holders(port: int, count: int) -> Iterator[int]:
    """`count` idle connections, held by child processes (one process has too few files)."""
    procs = []
    for start in range(0, count, HOLD_PER_PROCESS):
        n = min(HOLD_PER_PROCESS, count - start)
        cmd = [sys.executable, __file__, "--hold", str(port), str(n)]
        procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    try:
        yield sum(int(p.stdout.readline() or 0) for p in procs if p.stdout is not None)
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                p.communicate(timeout=60)  # closing stdin tells it to close its sockets


def hold(port: int, count: int) -> int:
    socks = idle_connections(port, count)
    print(len(socks), flush=True)
    sys.stdin.read()  # until the parent closes the pipe
    close_all(socks)
    return 0


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


def measure(src: Path, scenario: Path, args: argparse.Namespace) -> dict[str, str]:
    out: dict[str, str] = {}
    with served(src, scenario) as (proc, base):
        port = int(base.rsplit(":", 1)[1])
        url = base + "/metrics"
        idle = [scrape(url) for _ in range(5)]
        out["idle RSS"] = f"{rss_mb(proc.pid):.0f} MB"
        out["idle scrape (median of 5)"] = show(sorted(s for s in idle if s is not None)[2])

        socks = non_readers(port, args.non_readers)
        time.sleep(4)
        during = [scrape(url) for _ in range(3)]
        out[f"RSS, {args.non_readers} non-reading clients"] = f"{rss_mb(proc.pid):.0f} MB" + _opened(
            socks, args.non_readers
        )
        out["scrape meanwhile (worst of 3)"] = show(None if None in during else max(during))  # type: ignore[type-var]
        close_all(socks)
        time.sleep(3)

        with holders(port, args.idle) as opened:
            time.sleep(3)
            note = "" if opened == args.idle else f" ({opened} connected)"
            out[f"scrape with {args.idle} idle connections open"] = show(scrape(url)) + note
        time.sleep(2)
        out["RSS at the end"] = f"{rss_mb(proc.pid):.0f} MB"
    return out


def extract(ref: str, into: Path) -> Path:
    tar = subprocess.run(
        ["git", "archive", ref, "exporter"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(tar)) as t:
        t.extractall(into, filter="data")
    return into


def main() -> int:
    if sys.argv[1:2] == ["--hold"]:
        return hold(int(sys.argv[2]), int(sys.argv[3]))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="git ref of the version to compare with")
    p.add_argument("--gpus", type=int, nargs="+", default=[8, 72])
    p.add_argument("--non-readers", type=int, default=1000)
    p.add_argument("--idle", type=int, default=20000)
    args = p.parse_args()
    rows: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        before = extract(args.before, Path(tmp) / "before")
        for n in args.gpus:
            scenario = Path(tmp) / f"gpus{n}.yaml"
            scenario.write_text(SCENARIO.format(n=n))
            for name, src in ((f"before ({args.before})", before), ("after", ROOT)):
                print(f"{n} GPUs, {name} ...", file=sys.stderr, flush=True)
                for key, value in measure(src, scenario, args).items():
                    rows.setdefault(key, {})[f"{n} GPUs, {name}"] = value
    columns = list(next(iter(rows.values())))
    print("| | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for key, values in rows.items():
        print(f"| {key} | " + " | ".join(values.get(c, "") for c in columns) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
