"""End to end paging: simulated exporter -> Prometheus with the shipped rules -> Alertmanager
-> a webhook receiver in this test.

The `lab` fixture's Prometheus loads alerts/*.rules.yml with every `for:` cut to 2 s
(the shipped durations are the promtool unit tests' business). kv-pressure (node lab-kv)
must page LlmGpuKvCacheSaturated, sm-saturation (node-5) LlmGpuSmSaturated, each with its
labels and annotations filled in; the four healthy nodes, scraped by the same Prometheus
for the same time, must page nothing.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, Lab, wait_until

pytestmark = pytest.mark.integration

RULES = {
    r["alert"]: r
    for path in sorted((ROOT / "alerts").glob("*.rules.yml"))
    for g in yaml.safe_load(path.read_text())["groups"]
    for r in g["rules"]
    if "alert" in r
}
HEALTHY = ("node-1", "node-2", "node-3", "node-4")
PAGE_WAIT_S = 45.0
# What each scenario must fire in Prometheus (it may fire more, e.g. TTFT burn).
EXPECTED = {
    "node-5": {"LlmGpuSmSaturated", "LlmGpuTtftSloBurnFast"},
    "node-6": {"LlmGpuOomRiskHigh", "LlmGpuMemoryExhaustion"},
    "lab-kv": {"LlmGpuKvCacheSaturated", "LlmGpuTtftSloBurnFast"},
    "lab-mig": {"LlmGpuKvCacheSaturated"},
    "lab-thermal": {"LlmGpuClocksThrottled"},
    "lab-lost": {"LlmGpuLost", "LlmGpuXidCritical", "LlmGpuEngineDown"},
}
EXPECTED_LAB2 = {
    "more-ecc-errors": {"LlmGpuEccUncorrectable"},
    "more-oom-crash": {"LlmGpuOomRiskHigh", "LlmGpuMemoryExhaustion", "LlmGpuEngineDown"},
    "more-scheduler-bound": {"LlmGpuTtftSloBurnFast"},
}


def page(lab: Lab, alertname: str, node: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for alert in lab.webhook.alerts():
            labels = alert["labels"]
            if labels.get("alertname") == alertname and labels.get("node") == node:
                return alert
        return None

    try:
        left = max(2.0, PAGE_WAIT_S - (time.time() - lab.started))
        return wait_until(find, left, f"{alertname} from {node}")
    except TimeoutError:
        firing = [(a["labels"]["alertname"], a["labels"].get("node")) for a in lab.prom.alerts()]
        raise AssertionError(f"no {alertname} page from {node}; Prometheus alerts: {firing}") from None


def check_annotations(alert: dict[str, Any], name: str, instance: str) -> None:
    rule = RULES[name]
    annotations = alert["annotations"]
    assert annotations["summary"] == rule["annotations"]["summary"]
    assert annotations["runbook_url"].endswith(f"docs/runbooks.md#{name.lower()}")
    description = annotations["description"]
    assert instance in description and "{{" not in description and "<no value>" not in description


def test_kv_pressure_pages(lab: Lab) -> None:
    alert = page(lab, "LlmGpuKvCacheSaturated", "lab-kv")
    labels = alert["labels"]
    instance = lab.instance("lab-kv")
    assert alert["status"] == "firing"
    assert labels["severity"] == "critical"
    assert labels["instance"] == instance and labels["job"] == "llm-gpu-exporter"
    assert labels["cluster"] == "lab" and labels["scenario"] == "kv-pressure"
    assert labels["engine"] == "vllm" and labels["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert labels["target"]
    check_annotations(alert, "LlmGpuKvCacheSaturated", instance)
    assert "meta-llama/Llama-3.1-8B-Instruct" in alert["annotations"]["description"]


def test_sm_saturation_pages(lab: Lab) -> None:
    alert = page(lab, "LlmGpuSmSaturated", "node-5")
    labels = alert["labels"]
    instance = lab.instance("node-5")
    assert labels["severity"] == "warning"
    assert labels["instance"] == instance and labels["cluster"] == "fleet"
    assert labels["gpu"] in {str(i) for i in range(8)} and labels["uuid"].startswith("GPU-")
    check_annotations(alert, "LlmGpuSmSaturated", instance)
    assert "% of its SMs busy" in alert["annotations"]["description"]


def test_the_notification_is_alertmanagers_webhook_payload(lab: Lab) -> None:
    page(lab, "LlmGpuSmSaturated", "node-5")
    with lab.webhook.lock:
        payload = next(
            n for n in lab.webhook.notifications if n["groupLabels"].get("alertname") == "LlmGpuSmSaturated"
        )
    assert payload["version"] == "4"
    assert payload["receiver"] == "page"
    assert payload["status"] == "firing"
    assert set(payload["groupLabels"]) == {"alertname", "instance"}
    assert payload["alerts"][0]["generatorURL"].startswith("http://")


def test_healthy_nodes_page_nothing(lab: Lab) -> None:
    # wait until both unhealthy scenarios have paged: the healthy nodes had the same time
    page(lab, "LlmGpuKvCacheSaturated", "lab-kv")
    page(lab, "LlmGpuSmSaturated", "node-5")
    time.sleep(3)  # a page evaluated with the others would have been delivered by now
    healthy = {lab.instance(n) for n in HEALTHY}

    def starting(a: dict[str, Any]) -> bool:
        # Prometheus scrapes from its own start, and the exporters start at once on two
        # cores: with `for:` cut to 2 s, a scrape refused while an exporter starts pages it
        # as down before the lab is ready. That page is the alert doing its job, not news.
        began = datetime.fromisoformat(a["startsAt"]).timestamp()
        return bool(a["labels"]["alertname"] == "LlmGpuExporterDown" and began <= lab.ready)

    alerts = [a for a in lab.webhook.alerts() if a["labels"].get("instance") in healthy]
    paged = [a["labels"]["alertname"] for a in alerts if not starting(a)]
    assert paged == []
    pending = [a["labels"]["alertname"] for a in lab.prom.alerts() if a["labels"].get("instance") in healthy]
    assert pending == []


def test_rule_files_given_to_prometheus_are_the_shipped_ones(lab: Lab) -> None:
    """Only `for:` differs between what Prometheus ran and alerts/*.rules.yml."""
    assert lab.rule_dir is not None
    for shipped in sorted((ROOT / "alerts").glob("*.rules.yml")):
        ran = yaml.safe_load((Path(lab.rule_dir) / shipped.name).read_text())
        original = yaml.safe_load(shipped.read_text())
        for g_ran, g_orig in zip(ran["groups"], original["groups"], strict=True):
            for r_ran, r_orig in zip(g_ran["rules"], g_orig["rules"], strict=True):
                r_ran.pop("for", None)
                r_orig.pop("for", None)
                assert r_ran == r_orig


def firing_by_node(lab: Lab, expected: dict[str, set[str]]) -> dict[str, set[str]]:
    """Wait until every node fires (at least) its expected alerts; what fires, per node."""

    def firing() -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for alert in lab.prom.alerts():
            if alert["state"] == "firing":
                out.setdefault(alert["labels"].get("node", "?"), set()).add(alert["labels"]["alertname"])
        return out

    def complete() -> dict[str, set[str]] | None:
        now = firing()
        return now if all(want <= now.get(node, set()) for node, want in expected.items()) else None

    left = max(2.0, PAGE_WAIT_S - (time.time() - lab.started))
    try:
        return wait_until(complete, left, "the scenarios' alerts")
    except TimeoutError:
        raise AssertionError(f"firing: {firing()}\nexpected at least: {expected}") from None


def test_each_scenario_fires_its_alerts(lab: Lab) -> None:
    """The scenarios against the shipped rules: each fault raises its alert, healthy none,
    and the memory-bound (but healthy) node nothing critical."""
    now = firing_by_node(lab, EXPECTED)
    for node in HEALTHY:
        assert node not in now, f"{node} (healthy) fires {now.get(node)}"
    critical = [
        a["labels"]["alertname"]
        for a in lab.prom.alerts()
        if a["labels"].get("node") == "lab-decode" and a["labels"]["severity"] == "critical"
    ]
    assert critical == []


def test_rules_read_series_the_exporters_expose(lab: Lab) -> None:
    """Every metric a rule reads, and the label values rules match on, exist in the scrapes."""
    from dashboards.common import metric_names

    names: set[str] = set()
    for path in sorted((ROOT / "alerts").glob("*.rules.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names |= {n for r in group["rules"] for n in metric_names(r["expr"]) if n.startswith("llmgpu_")}
    selectors = [
        *sorted(names),
        'llmgpu_engine_requests_total{finish_reason="error"}',
        'llmgpu_engine_time_to_first_token_seconds_bucket{le="0.1"}',
        'llmgpu_engine_time_to_first_token_seconds_bucket{le="0.25"}',
        'llmgpu_gpu_clock_event_seconds_total{reason="hw_thermal"}',
        'llmgpu_gpu_clock_event_active{reason="sw_thermal"}',
        'llmgpu_gpu_xid_errors_total{xid="79"}',
    ]
    time.sleep(max(0.0, lab.started + 22 - time.time()))  # every scenario has played
    missing = [s for s in selectors if not lab.prom.query(f"count({s})")]
    assert missing == []


def test_exporter_down_pages(lab: Lab) -> None:
    """Stop one exporter: Prometheus' `up` goes to 0 and LlmGpuExporterDown pages."""
    lab.exporters["lab-doomed"].stop()
    try:
        alert = wait_until(
            lambda: next(
                (
                    a
                    for a in lab.webhook.alerts()
                    if a["labels"]["alertname"] == "LlmGpuExporterDown"
                    and a["labels"].get("node") == "lab-doomed"
                ),
                None,
            ),
            30,
            "LlmGpuExporterDown from lab-doomed",
        )
    except TimeoutError:
        raise AssertionError(f"Prometheus alerts: {[a['labels'] for a in lab.prom.alerts()]}") from None
    instance = lab.instance("lab-doomed")
    assert alert["labels"]["severity"] == "critical"
    assert alert["labels"]["job"] == "llm-gpu-exporter" and alert["labels"]["instance"] == instance
    check_annotations(alert, "LlmGpuExporterDown", instance)


def test_more_scenarios_fire_their_alerts(lab2: Lab) -> None:
    """ECC errors, an OOM crash and a CPU-bound scheduler raise theirs; small batches (a
    GPU busy but idle, users unaffected) raise nothing critical."""
    firing_by_node(lab2, EXPECTED_LAB2)
    critical = [
        a["labels"]["alertname"]
        for a in lab2.prom.alerts()
        if a["labels"].get("node") == "more-small-batches" and a["labels"]["severity"] == "critical"
    ]
    assert critical == []
