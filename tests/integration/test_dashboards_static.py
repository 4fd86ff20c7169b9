"""The dashboards as code: generated JSON current, conventions kept, every query parses.

No servers: promtool parses the queries (as recording rules, the one way promtool 2.42
parses PromQL); everything else reads the grafanalib sources and the JSON.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, expand

from dashboards import generate
from dashboards.common import DATASOURCE, Query, queries
from exporter.sim.scenario import builtin_names

BOARDS = {path.name.removesuffix(".dashboard.py"): board for path, board in generate.boards().items()}
UIDS = {
    "fleet": "llmgpu-fleet",
    "node": "llmgpu-node",
    "engine": "llmgpu-engine",
    "diagnosis": "llmgpu-diagnosis",
}
VARIABLES = {
    "fleet": ["datasource", "cluster"],
    "node": ["datasource", "cluster", "node", "gpu"],
    "engine": ["datasource", "cluster", "node", "namespace", "model", "target"],
    "diagnosis": ["datasource", "cluster", "node", "layer", "gpu"],
}
# What the dashboards must show, as panel titles (the list, panel by panel).
REQUIRED = {
    "fleet": [
        "GPUs by state",
        "SM active by node",
        "DRAM bandwidth by node",
        "Memory used by node",
        "Active findings by layer",
        "Nodes at OOM risk",
        "Generated tokens/s per model",
    ],
    "node": [
        "Utilization vs SM active vs tensor active",
        "DRAM bandwidth saturation",
        "Memory used, reserved and free",
        "Engine memory budget",
        "SM clock",
        "Throttle reasons",
        "Power and limit",
        "Temperature",
        "PCIe throughput",
        "NVLink throughput from the link counters",
        "NVLink errors",
        "XID errors",
        "ECC errors",
        "Per-process memory",
    ],
    "engine": [
        "Time to first token",
        "Inter-token latency",
        "End-to-end request latency",
        "Queue time",
        "Tokens/s",
        "Running and waiting",
        "KV-cache usage",
        "Preemptions/s",
        "Prefix-cache hit ratio",
        "Speculative-decoding acceptance",
        "SM and tensor activity of the engine's GPUs",
    ],
    "diagnosis": [
        "Findings over time per layer",
        "OOM-risk score",
        "Evidence: KV cache and preemptions (memory/kv_cache_saturated)",
        "Evidence: SM saturation (capacity/sm_saturation)",
    ],
}
# Grafana's values for the variables when checking syntax only.
ANY = {
    "cluster": ".*",
    "node": ".*",
    "gpu": ".*",
    "namespace": ".*",
    "model": ".*",
    "target": ".*",
    "layer": ".*",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "3h",
}


def test_generated_json_is_current() -> None:
    """`python -m dashboards.generate --check` passes: no stale JSON, no broken convention."""
    assert generate.main(["--check"]) == 0


def test_check_fails_on_stale_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = ROOT / "dashboards" / "fleet.dashboard.py"
    (tmp_path / src.name).write_text(src.read_text())
    (tmp_path / "fleet.json").write_text("{}\n")
    monkeypatch.setattr(generate, "HERE", tmp_path)
    monkeypatch.setattr(generate, "DOC", tmp_path / "dashboards.md")  # keep the real doc out
    assert generate.main(["--check"]) == 1
    assert generate.main([]) == 0  # regenerates
    assert generate.main(["--check"]) == 0


def test_one_json_per_source() -> None:
    sources = {p.name.removesuffix(".dashboard.py") for p in (ROOT / "dashboards").glob("*.dashboard.py")}
    outputs = {p.stem for p in (ROOT / "dashboards").glob("*.json")}
    assert sources == outputs == set(UIDS)


@pytest.mark.parametrize("name", sorted(UIDS))
def test_uid_and_variables(name: str) -> None:
    data = json.loads((ROOT / "dashboards" / f"{name}.json").read_text())
    assert data["uid"] == UIDS[name]
    names = [v["name"] for v in data["templating"]["list"]]
    assert names == VARIABLES[name]
    datasource = data["templating"]["list"][0]
    assert datasource["type"] == "datasource" and datasource["query"] == "prometheus"
    for var in data["templating"]["list"][1:]:
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE
            assert var["includeAll"] and var["allValue"] == ".*"


@pytest.mark.parametrize("name", sorted(UIDS))
def test_panels_use_the_datasource_variable_and_stable_ids(name: str) -> None:
    data = json.loads((ROOT / "dashboards" / f"{name}.json").read_text())
    panels = []
    for panel in data["panels"]:
        panels.append(panel)
        panels += panel.get("panels", [])
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    for panel in panels:
        if panel["type"] in ("row", "text"):
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE
            assert (
                "$__rate_interval" in target["expr"]
                or "rate(" not in target["expr"]
                or re.search(r"\[\d+m\]", target["expr"])
            ), f"{panel['title']}: rate() windows use $__rate_interval"


@pytest.mark.parametrize("name", sorted(UIDS))
def test_panel_titles_unique(name: str) -> None:
    titles = [p.title for p in BOARDS[name]._iter_panels() if p.title]
    assert len(titles) == len(set(titles)), sorted(t for t in titles if titles.count(t) > 1)


@pytest.mark.parametrize("name", sorted(UIDS))
def test_required_panels(name: str) -> None:
    titles = {title for title, _ in queries(BOARDS[name])}
    missing = [t for t in REQUIRED[name] if t not in titles]
    assert missing == []


def test_every_diagnosis_rule_has_its_evidence() -> None:
    """Each rule of the diagnosis is named on the Diagnosis dashboard, beside its series."""
    from exporter.diagnosis.rules import RULES

    text = " ".join(f"{p.title} {p.description or ''}" for p in BOARDS["diagnosis"]._iter_panels())
    missing = [rule.id for rule in RULES if rule.id not in text]
    assert missing == []


def test_query_scenarios_exist() -> None:
    known = set(builtin_names())
    for board in BOARDS.values():
        for title, query in queries(board):
            assert isinstance(query, Query)
            assert set(query.scenarios) <= known, f"{title}: {query.scenarios}"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_every_query_parses(tmp_path: Path) -> None:
    rules = []
    for name, board in sorted(BOARDS.items()):
        for i, (title, query) in enumerate(queries(board)):
            rules.append({"record": f"dashboard:{name}_{i}:check", "expr": expand(query.expr, ANY)})
            del title
    path = tmp_path / "dashboard-queries.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
