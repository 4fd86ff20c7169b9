"""The diagnosis page in a real browser: headless Chromium loads / of a running exporter.

For two scenarios the exporter is started as a user would (`python -m exporter.cli serve
--simulate NAME --speed 60`), the test waits until the JSON API reports the scenario's
declared findings, then asks Chromium for the rendered DOM (the findings must be on the
page) and for a screenshot, into a temporary directory: `make docs` takes the README's
pictures the same way (exporter/docgen/screenshots.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporter.docgen.screenshots import CHROMIUM, SCENARIOS, chromium, screenshot, served, wait_for_findings
from exporter.sim.scenario import load_builtin

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium")


@pytest.mark.parametrize("name", SCENARIOS)
def test_page_shows_the_scenario_findings(name: str, tmp_path: Path) -> None:
    expected = set(load_builtin(name).expect_findings)
    with served(name) as url:
        data = wait_for_findings(url, expected)
        assert data["status"] in ("warning", "critical")

        dom = chromium("--dump-dom", f"{url}/")
        shown = set(re.findall(r"data-finding=\"([a-z_]+/[a-z_]+)\"", dom))
        assert expected <= shown, f"page shows {sorted(shown)}"
        text = re.sub(r"<[^>]+>", " ", dom)
        for finding in expected:
            assert finding in text
        assert "Advice:" in text and "OOM risk" in text
        assert "cdn" not in dom.lower() and "https://" not in dom  # self-contained, works offline

        shot = screenshot(url, tmp_path / f"diagnosis-{name}.png")
        assert shot.stat().st_size > 20_000
