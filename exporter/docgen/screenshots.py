"""`python -m exporter.docgen.screenshots [--out DIR]`: the README's pictures of the page.

Each picture is a simulated node served as a user serves it (`serve --simulate NAME`),
photographed by headless Chromium once its scenario's declared findings are all active.
The browser test (tests/integration/test_page.py) takes the same pictures into a
temporary directory; `make docs` takes them into docs/img.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from exporter.sim.scenario import load_builtin

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ("thermal-throttle", "kv-pressure")  # the README's and docs/diagnosis.md's
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def served(name: str) -> Iterator[str]:
    """The scenario played at 60 times real time (a snapshot every 6 scenario seconds,
    engines scraped as often); yields its base URL."""
    port = _free_port()
    cmd = [
        sys.executable, "-m", "exporter.cli", "serve", "--simulate", name, "--speed", "60",
        "--interval", "0.1", "--engine-interval", "0.1", "--listen", f"127.0.0.1:{port}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def wait_for_findings(url: str, expected: set[str], timeout_s: float = 90.0) -> dict[str, object]:
    """The diagnosis JSON once every expected finding is active."""
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{url}/api/v1/diagnosis", timeout=5)
            if r.status_code == 200:
                data = r.json()
                seen = {f["id"] for f in data["findings"]}
                if expected <= seen:
                    return dict(data)
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url}: expected findings {sorted(expected)} never all active (last: {sorted(seen)})")


def chromium(*args: str) -> str:
    """Headless Chromium's stdout; raises with its stderr when it fails."""
    if CHROMIUM is None:
        raise FileNotFoundError("chromium is not installed (Debian: apt-get install chromium)")
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def screenshot(url: str, out: Path) -> Path:
    chromium(f"--screenshot={out}", "--window-size=1400,1800", f"{url}/")
    return out


def take(name: str, out_dir: Path) -> Path:
    """The page of scenario `name` with its findings active, as out_dir/diagnosis-NAME.png."""
    with served(name) as url:
        wait_for_findings(url, set(load_builtin(name).expect_findings))
        return screenshot(url, out_dir / f"diagnosis-{name}.png")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m exporter.docgen.screenshots", description=__doc__)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="directory (default docs/img)")
    args = p.parse_args(argv)
    if CHROMIUM is None:
        print("chromium not found: the pictures are left as they are", file=sys.stderr)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name in SCENARIOS:
        print(take(name, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
