"""What the diagnosis hands out: metrics, JSON, the page, the terminal report, the routes."""

from __future__ import annotations

import json
from dataclasses import replace

from fastapi import FastAPI
from fastapi.testclient import TestClient

from exporter.diagnosis.diagnoser import Diagnoser
from exporter.diagnosis.model import Diagnosis
from exporter.diagnosis.report import exit_code, render_text
from exporter.snapshot import Snapshot
from exporter.web.exposition import render
from exporter.web.page import render_page
from exporter.web.routes import router
from tests.support.diagnosis_builders import engine, feed, frame, gpu


def hot_node() -> Diagnoser:
    d = Diagnoser()
    frames = [
        frame(
            i * 5.0,
            (replace(gpu(0), throttle_reasons=("sw_thermal",), temperature_celsius=91.0), gpu(1)),
            (engine(gpus=(0, 1), kv_usage_ratio=0.99, preemptions_total=10.0 * i, waiting=30.0),),
        )
        for i in range(40)
    ]
    feed(d, frames)
    return d


def quiet_node() -> Diagnoser:
    d = Diagnoser()
    feed(d, [frame(i * 5.0, (gpu(0), gpu(1)), (engine(gpus=(0, 1)),)) for i in range(10)])
    return d


def snapshot_of(d: Diagnoser) -> Snapshot:
    """A snapshot carrying what the Diagnoser returned, as the runner composes it."""
    assert d.latest is not None and d.history.latest is not None
    states, ratios, diagnosis = d.step(d.history.latest)
    return Snapshot(taken_at=diagnosis.taken_at).with_node((states, ratios, diagnosis))


def test_metrics_every_rule_always_present_active_ones_at_one() -> None:
    text = render(snapshot_of(hot_node())).text.decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("llmgpu_diagnosis_finding{")]
    assert any(
        'layer="hardware"' in ln
        and 'rule="thermal_throttle"' in ln
        and 'gpu="0"' in ln
        and ln.endswith(" 1.0")
        for ln in lines
    )
    assert any('rule="thermal_throttle"' in ln and 'gpu="1"' in ln and ln.endswith(" 0.0") for ln in lines)
    assert any(
        'rule="kv_cache_saturated"' in ln and 'severity="warning"' in ln and ln.endswith(" 1.0")
        for ln in lines
    )
    assert sum(ln.endswith(" 1.0") for ln in lines) == 2
    assert "# TYPE llmgpu_diagnosis_finding gauge" in text
    ratios = [ln for ln in text.splitlines() if ln.startswith("llmgpu_diagnosis_oom_risk_ratio{")]
    assert len(ratios) == 2 and all('uuid="GPU-000' in ln and "target=" in ln for ln in ratios)


def test_json_is_plain_and_complete() -> None:
    d = hot_node().latest
    assert d is not None
    data = json.loads(json.dumps(d.to_json()))
    assert data["status"] == "warning"
    assert {f["id"] for f in data["findings"]} == {"hardware/thermal_throttle", "memory/kv_cache_saturated"}
    f = next(f for f in data["findings"] if f["id"] == "hardware/thermal_throttle")
    assert f["gpu"] == "0" and f["target"] == "" and f["advice"] and f["evidence"]
    assert any(e["text"] == "91 °C" for e in f["evidence"])
    assert data["summary"]["active_findings"] == 2 and data["summary"]["by_severity"]["warning"] == 2
    assert len(data["gpus"]) == 2 and len(data["engines"]) == 1
    trend = data["gpus"][0]["trends"][0]
    assert trend["name"] == "SM active" and len(trend["points"]) >= 10
    assert len(data["rules"]) >= 20


def test_report_and_exit_code() -> None:
    hot = hot_node().latest
    quiet = quiet_node().latest
    assert hot is not None and quiet is not None
    text = render_text(hot.to_json())
    assert "hardware/thermal_throttle" in text and "memory/kv_cache_saturated" in text
    assert "advice:" in text and "GPU temperature: 91 °C" in text
    assert exit_code(hot.to_json()) == 1
    calm = render_text(quiet.to_json())
    assert "No active findings" in calm and exit_code(quiet.to_json()) == 0
    assert "\033[" not in text and "\033[" in render_text(hot.to_json(), color=True)


def test_page_is_self_contained_and_escapes() -> None:
    d = Diagnoser()
    evil = engine(gpus=(0,), name="<script>alert(1)</script>", kv_usage_ratio=0.99)
    feed(d, [frame(i * 5.0, (gpu(0),), (replace(evil, preemptions_total=5.0 * i),)) for i in range(30)])
    assert d.latest is not None
    html = render_page(d.latest.to_json())
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html
    assert "data-finding='memory/kv_cache_saturated'" in html
    assert "http://" not in html.replace(evil.target, "") and "https://" not in html
    assert "<svg" in html and "polyline" in html
    assert "Waiting for the first snapshot" in render_page(None)


def test_routes_before_and_after_the_first_snapshot() -> None:
    current: list[Snapshot | None] = [None]
    app = FastAPI()
    app.include_router(router(lambda: current[0]))
    client = TestClient(app)
    assert client.get("/api/v1/diagnosis").status_code == 503
    page = client.get("/")
    assert page.status_code == 200 and "Waiting" in page.text
    current[0] = snapshot_of(hot_node())
    r = client.get("/api/v1/diagnosis")
    assert r.status_code == 200 and r.json()["status"] == "warning"
    page = client.get("/")
    assert page.headers["content-type"].startswith("text/html")
    assert "hardware/thermal_throttle" in page.text


def test_diagnosis_reading_exports_nothing_itself() -> None:
    snap = Snapshot(taken_at=1.0).with_node((Diagnosis(taken_at=1.0),))
    assert "llmgpu_diagnosis" not in render(snap).text.decode()


def test_gpu_ranges_in_the_report() -> None:
    from exporter.diagnosis.report import ranges

    assert ranges([str(i) for i in range(8)]) == "0-7"
    assert ranges(["5", "0", "2", "3"]) == "0,2-3,5"
    assert ranges([]) == ""
