"""Exposition: the catalog is current, and every scenario's scrape is clean for promtool."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter import catalog
from exporter.config import Settings
from exporter.metricdef import Histogram, MetricDef, samples
from exporter.sim import node
from exporter.sim.scenario import builtin_names
from exporter.snapshot import Snapshot
from exporter.web.exposition import EVERYTHING, render

ROOT = Path(__file__).resolve().parents[2]


def test_catalog_names_follow_conventions() -> None:
    for metric, labels, _ in catalog.rows():
        assert metric.name.startswith("llmgpu_"), metric.name
        assert not re.search(r"_(percent|mib|mb|ms|milliwatts)\b", metric.name), metric.name
        assert (metric.kind == "counter") == metric.name.endswith("_total"), metric.name
        assert len(labels) == len(set(labels)), metric.name


def _scrape(name: str) -> str:
    *_, last = node.play(Settings(simulate=name), step_s=60.0)
    return render(last, EVERYTHING).text.decode()  # the full profile: every family, a superset


@pytest.mark.system
@pytest.mark.parametrize("scenario", builtin_names())
def test_scenario_scrape_passes_promtool_and_catalog(scenario: str) -> None:
    text = _scrape(scenario)
    exposed = {f.name for f in text_string_to_metric_families(text)}
    known = {m.name.removesuffix("_total") if m.kind == "counter" else m.name for m, _, _ in catalog.rows()}
    assert exposed <= known, f"not in docs/metrics.md: {sorted(exposed - known)}"
    assert "llmgpu_gpu_up" in exposed and "llmgpu_exporter_simulated" in exposed
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: make system-deps installs Debian's prometheus package"
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert result.stdout + result.stderr == "", result.stdout + result.stderr


def test_histogram_and_info_render() -> None:
    from dataclasses import dataclass

    from exporter.metricdef import histogram, info, label

    @dataclass(frozen=True)
    class R:
        target: str = label()
        h: Histogram | None = histogram("llmgpu_test_seconds", "A test histogram")
        i: dict[str, str] | None = info("llmgpu_test_info", "A test info")

    reading = R(
        target="a:1", h=Histogram(((0.1, 1.0), (1.0, 3.0), (float("inf"), 4.0)), 2.5, 4.0), i={"k": "v"}
    )
    snap = Snapshot(taken_at=0.0, node={R: (reading,)})
    text = render(snap).text.decode()
    assert 'llmgpu_test_seconds_bucket{le="+Inf",target="a:1"} 4.0' in text
    assert 'llmgpu_test_seconds_bucket{le="0.1",target="a:1"} 1.0' in text
    assert 'llmgpu_test_seconds_sum{target="a:1"} 2.5' in text
    assert 'llmgpu_test_info{k="v",target="a:1"} 1.0' in text
    assert [m.name for m, _, _ in samples(reading)] == ["llmgpu_test_seconds", "llmgpu_test_info"]
    assert isinstance(next(iter(samples(reading)))[0], MetricDef)


def test_help_with_a_quote_is_escaped_in_openmetrics_only() -> None:
    """OpenMetrics escapes `"` in HELP (client_python's openmetrics writer); the text
    format escapes only backslash and newline, so a quote stays as it is there."""
    from dataclasses import dataclass

    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families

    from exporter.metricdef import counter, gauge

    said = 'nvml.h: "Value can be wrapped" (a \\ too)'

    @dataclass(frozen=True)
    class R:
        g: float | None = gauge("llmgpu_test_quoted", said)
        c: int | None = counter("llmgpu_test_quoted_things_total", said)

    rendered = render(Snapshot(taken_at=0.0, node={R: (R(g=1.0, c=2),)}))
    om = rendered.openmetrics.decode()
    assert '# HELP llmgpu_test_quoted nvml.h: \\"Value can be wrapped\\" (a \\\\ too)\n' in om
    assert '# HELP llmgpu_test_quoted_things nvml.h: \\"Value can be wrapped\\"' in om
    assert {f.name: f.documentation for f in om_families(om)} == {
        "llmgpu_test_quoted": said,
        "llmgpu_test_quoted_things": said,
    }
    text = rendered.text.decode()
    assert '# HELP llmgpu_test_quoted nvml.h: "Value can be wrapped" (a \\\\ too)\n' in text
    assert {f.name: f.documentation for f in text_string_to_metric_families(text)}[
        "llmgpu_test_quoted"
    ] == said
