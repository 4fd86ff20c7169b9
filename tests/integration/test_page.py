"""The diagnosis page in a real browser: headless Chromium loads / of a running exporter.

For two scenarios the exporter is started as a user would (`python -m exporter.cli serve
--simulate NAME --speed 60`), the test waits until the JSON API reports the scenario's
declared findings, then asks Chromium for the rendered DOM (the findings must be on the
page) and for a screenshot, saved to docs/img/ for the README.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from exporter.sim.scenario import load_builtin

ROOT = Path(__file__).resolve().parents[2]
IMG = ROOT / "docs" / "img"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCENARIOS = ("thermal-throttle", "kv-pressure")

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def exporter(request: pytest.FixtureRequest) -> Iterator[str]:
    name = request.param
    port = free_port()
    env = {
        **os.environ,
        # one snapshot every 6 scenario seconds at speed 60, engines scraped as often
        "LLMGPU_ENGINE_INTERVAL": "0.1",
        "PYTHONPATH": str(ROOT),
    }
    cmd = [
        sys.executable, "-m", "exporter.cli", "serve", "--simulate", name, "--speed", "60",
        "--interval", "0.1", "--listen", f"127.0.0.1:{port}",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
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
    raise AssertionError(
        f"{url}: expected findings {sorted(expected)} never all active (last: {sorted(seen)})"
    )


def chromium(*args: str) -> str:
    assert CHROMIUM is not None
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("exporter", SCENARIOS, indirect=True)
def test_page_shows_the_scenario_findings(exporter: str, request: pytest.FixtureRequest) -> None:
    name = request.node.callspec.params["exporter"]
    expected = set(load_builtin(name).expect_findings)
    data = wait_for_findings(exporter, expected)
    assert data["status"] in ("warning", "critical")

    dom = chromium("--dump-dom", f"{exporter}/")
    shown = set(re.findall(r"data-finding=\"([a-z_]+/[a-z_]+)\"", dom))
    assert expected <= shown, f"page shows {sorted(shown)}"
    text = re.sub(r"<[^>]+>", " ", dom)
    for finding in expected:
        assert finding in text
    assert "Advice:" in text and "OOM risk" in text
    assert "cdn" not in dom.lower() and "https://" not in dom  # self-contained, works offline

    IMG.mkdir(parents=True, exist_ok=True)
    shot = IMG / f"diagnosis-{name}.png"
    chromium(f"--screenshot={shot}", "--window-size=1400,1800", f"{exporter}/")
    assert shot.stat().st_size > 20_000
