"""The alert and recording rules: promtool checks and unit tests, and the conventions.

promtool (Debian package `prometheus`) parses every rule and runs the unit tests in
alerts/tests/*.test.yml. The conventions come from node-mixin: CamelCase alert names
with a shared prefix, a severity label, summary / description / runbook_url
annotations, recording rules named level:metric:operations.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dashboards import catalog  # noqa: E402
from dashboards.common import metric_names  # noqa: E402

ALERTS = ROOT / "alerts"
RULE_FILES = sorted(ALERTS.glob("*.rules.yml"))
UNIT_TESTS = sorted((ALERTS / "tests").glob("*.test.yml"))
RUNBOOKS = ROOT / "docs" / "runbooks.md"
RUNBOOK_URL = "https://github.com/llm-gpu-exporter/llm-gpu-exporter/blob/main/docs/runbooks.md#"
SEVERITIES = {"critical", "warning", "info"}

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")


def rules() -> list[dict[str, Any]]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += group["rules"]
    return out


ALERT_RULES = [r for r in rules() if "alert" in r]
RECORDING_RULES = [r for r in rules() if "record" in r]


def duration_s(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    total = 0.0
    for number, unit in re.findall(r"(\d+)(ms|s|m|h|d)", text):
        total += int(number) * units[unit]
    return total


def test_rule_files_exist() -> None:
    assert [p.name for p in RULE_FILES] == ["llmgpu-alerts.rules.yml", "llmgpu-recording.rules.yml"]
    assert len(ALERT_RULES) >= 15
    assert RECORDING_RULES


@needs_promtool
def test_promtool_check_rules() -> None:
    result = subprocess.run(
        ["promtool", "check", "rules", *map(str, RULE_FILES)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr


@needs_promtool
def test_promtool_unit_tests() -> None:
    result = subprocess.run(
        ["promtool", "test", "rules", *map(str, UNIT_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ALERTS / "tests",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(UNIT_TESTS)


@pytest.mark.parametrize("rule", ALERT_RULES, ids=lambda r: r["alert"])
def test_alert_conventions(rule: dict[str, Any]) -> None:
    name = rule["alert"]
    assert re.fullmatch(r"LlmGpu(?:[A-Z][a-z0-9]+)+", name), f"{name}: CamelCase with the LlmGpu prefix"
    assert rule["labels"]["severity"] in SEVERITIES
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    assert "{{" not in annotations["summary"], "the summary is static; labels go in the description"
    if rule["expr"].lstrip().startswith("absent("):
        # absent() returns one series without the labels of the targets that vanished
        assert "{{" not in annotations["description"], "absent() leaves no labels to fill in"
    else:
        assert "$labels.instance" in annotations["description"], "the description names the node"
    assert annotations["runbook_url"] == RUNBOOK_URL + name.lower()


def test_alert_names_unique() -> None:
    names = [r["alert"] for r in ALERT_RULES]
    assert len(names) == len(set(names))


def test_every_alert_has_a_runbook_section() -> None:
    text = RUNBOOKS.read_text()
    headings = re.findall(r"^## (\S+)\s*$", text, re.M)
    for rule in ALERT_RULES:
        assert rule["alert"] in headings, f"docs/runbooks.md has no '## {rule['alert']}' section"
    body = dict(zip(headings, re.split(r"^## \S+\s*$", text, flags=re.M)[1:], strict=True))
    for rule in ALERT_RULES:
        section = body[rule["alert"]]
        for part in ("Meaning", "Confirm", "Act"):
            assert f"**{part}" in section, f"{rule['alert']}: runbook section lacks **{part}**"


def _unit_cases() -> list[dict[str, Any]]:
    cases = []
    for path in UNIT_TESTS:
        cases += yaml.safe_load(path.read_text())["tests"]
    return cases


@pytest.mark.parametrize("rule", ALERT_RULES, ids=lambda r: r["alert"])
def test_every_alert_is_unit_tested(rule: dict[str, Any]) -> None:
    """Fires in a test case, and the same case shows it silent before (the `for:` wait)."""
    name = rule["alert"]
    fired_after_silence = False
    fired = False
    for case in _unit_cases():
        checks = [c for c in case.get("alert_rule_test", []) if c["alertname"] == name]
        firing = [duration_s(c["eval_time"]) for c in checks if c.get("exp_alerts")]
        silent = [duration_s(c["eval_time"]) for c in checks if not c.get("exp_alerts")]
        fired |= bool(firing)
        if firing and silent and min(silent) < min(firing):
            fired_after_silence = True
            for_s = duration_s(rule.get("for", "0s"))
            # the silent check lies inside the `for:` wait (or right before the condition)
            assert min(firing) - max(s for s in silent if s < min(firing)) <= max(for_s, 60) + 120
        for check in checks:
            for alert in check.get("exp_alerts") or []:
                assert alert["exp_labels"]["severity"] == rule["labels"]["severity"]
                assert set(alert["exp_annotations"]) == {"summary", "description", "runbook_url"}
    assert fired, f"{name}: no unit test where it fires"
    assert fired_after_silence, f"{name}: no unit test where it is silent before it fires"


def test_recording_rule_names() -> None:
    for rule in RECORDING_RULES:
        assert re.fullmatch(r"[a-z_]+:llmgpu_[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]


def test_rules_read_only_known_metrics() -> None:
    names: set[str] = set()
    for rule in rules():
        names |= set(metric_names(rule["expr"]))
    assert catalog.problems(sorted(names)) == []


def test_every_recording_rule_is_used() -> None:
    """A recorded series nobody reads is cost without value: each feeds a dashboard or alert."""
    used: set[str] = set()
    for path in (ROOT / "dashboards").glob("*.json"):
        used |= set(re.findall(r"[a-z_]+:llmgpu_[a-z0-9_]+:[a-z0-9_]+", path.read_text()))
    for rule in rules():
        used |= set(metric_names(rule["expr"]))
    unused = [r["record"] for r in RECORDING_RULES if r["record"] not in used]
    assert unused == []


def test_runbooks_name_panels_that_exist() -> None:
    """'*Dashboard* -> *Panel*' in a runbook names a panel of that dashboard (or the start of
    its title, for the evidence panels whose titles end with the rule ids)."""
    from dashboards import generate

    names = {"fleet": "Fleet", "node": "Node & GPU", "engine": "Engine", "diagnosis": "Diagnosis"}
    titles = {
        names[path.name.removesuffix(".dashboard.py")]: [p.title for p in board._iter_panels()]
        for path, board in generate.boards().items()
    }
    text = RUNBOOKS.read_text()
    checked, wrong = 0, []
    end = r"(?=\n- |\n\n|;|\. [A-Z]|\*[^*\n]+\* →)"
    for match in re.finditer(r"\*([^*]+)\* → (.*?)" + end, text, re.S):
        board = match.group(1)
        if board not in titles:
            continue
        for ref in re.findall(r"\*([^*]+)\*", match.group(2)):
            ref = " ".join(ref.split())
            checked += 1
            if not any(t == ref or t.startswith(ref + " (") for t in titles[board]):
                wrong.append(f"{board} → {ref}")
    assert wrong == []
    assert checked >= 40
