"""`llm-gpu-exporter serve` as a user starts it, in a child process, for the tests that
need the real command line: signals, exit codes, the Docker health check."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def served(
    port: int, *flags: str, scenario: str = "healthy", env: Mapping[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A simulated node served on 127.0.0.1:port, with the line it printed when set up
    ("llm-gpu-exporter V serving http(s)://...", just before the socket opens; empty if it ended first);
    stopped on exit if it still runs."""
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "exporter.cli", "serve", "--simulate", scenario),
            *("--listen", f"127.0.0.1:{port}", "--no-discover-processes", *flags),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        # log lines may come first; the "serving" line is printed once the server is set up
        line = proc.stdout.readline()
        while line and " serving " not in line:
            line = proc.stdout.readline()
        yield proc, line
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
