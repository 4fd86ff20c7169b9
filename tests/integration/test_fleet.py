"""Six nodes in the `fleet` cluster, four healthy: the fleet view must single out the other two.

node-5 plays sm-saturation (every SM busy), node-6 memory-leak (one GPU's memory leaves
the engine's budget and fills up). The checks read the recording rules and the fleet
dashboard's own queries, with the dashboard's `cluster` variable set to `fleet`, from the
real Prometheus of the `lab` fixture.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import FLEET, UNHEALTHY_FLEET_NODES, Lab, expand

from dashboards import generate
from dashboards.common import queries

pytestmark = pytest.mark.integration

FLEET_BOARD = next(b for p, b in generate.boards().items() if p.name == "fleet.dashboard.py")
SETTLE_S = 22.0


@pytest.fixture(scope="module")
def fleet(lab: Lab) -> Lab:
    time.sleep(max(0.0, lab.started + SETTLE_S - time.time()))
    return lab


def nodes(result: list[dict[str, Any]]) -> set[str]:
    return {r["metric"].get("node", "?") for r in result}


def value(r: dict[str, Any]) -> float:
    return float(r["value"][1])


def panel_query(title: str, ref: str = "A") -> str:
    for panel_title, query in queries(FLEET_BOARD):
        if panel_title == title and query.refId == ref:
            return expand(query.expr, {"cluster": "fleet"})
    raise KeyError(title)


def test_recorded_sm_activity_singles_out_the_saturated_node(fleet: Lab) -> None:
    result = fleet.prom.query('instance:llmgpu_gpu_sm_active_ratio:avg{cluster="fleet"}')
    by_node = {r["metric"]["node"]: value(r) for r in result}
    assert set(by_node) == set(FLEET)
    assert by_node["node-5"] > 0.95
    assert all(v < 0.7 for n, v in by_node.items() if n != "node-5")


def test_recorded_gpu_states(fleet: Lab) -> None:
    """34 GPUs serving (4 healthy x 8 + the leaking node's 2), node-5's 8 saturated."""
    counts = {
        r["metric"]["state"]: value(r)
        for r in fleet.prom.query('cluster_state:llmgpu_gpus:count{cluster="fleet"}')
    }
    assert counts == {"serving": 34.0, "saturated": 8.0}
    not_serving = fleet.prom.query('instance_state:llmgpu_gpus:count{cluster="fleet", state!="serving"}')
    assert nodes(not_serving) == {"node-5"}


def test_recorded_oom_risk_and_headroom_single_out_the_leaking_node(fleet: Lab) -> None:
    risky = fleet.prom.query('instance:llmgpu_diagnosis_oom_risk_ratio:max{cluster="fleet"} >= 0.6')
    assert nodes(risky) == {"node-6"}
    full = fleet.prom.query('instance:llmgpu_gpu_memory_free:min_ratio{cluster="fleet"} < 0.05')
    assert nodes(full) == {"node-6"}


def test_recorded_findings_only_on_the_two_unhealthy_nodes(fleet: Lab) -> None:
    result = fleet.prom.query('instance_layer:llmgpu_diagnosis_findings:sum{cluster="fleet"} > 0')
    layers = {(r["metric"]["node"], r["metric"]["layer"]) for r in result}
    assert {n for n, _ in layers} == set(UNHEALTHY_FLEET_NODES)
    assert ("node-5", "capacity") in layers
    assert ("node-6", "memory") in layers


def test_fleet_dashboard_tables_name_the_unhealthy_nodes(fleet: Lab) -> None:
    prom = fleet.prom
    assert nodes(prom.query(panel_query("Nodes with GPUs not serving"))) == {"node-5"}
    assert nodes(prom.query(panel_query("Findings by node and layer"))) == set(UNHEALTHY_FLEET_NODES)
    assert nodes(prom.query(panel_query("Nodes at OOM risk", "A"))) == {"node-6"}
    assert nodes(prom.query(panel_query("Nodes at OOM risk", "B"))) == {"node-6"}


def test_fleet_dashboard_stats(fleet: Lab) -> None:
    prom = fleet.prom
    assert value(prom.query(panel_query("GPUs"))[0]) == 42
    assert value(prom.query(panel_query("GPUs not serving"))[0]) == 8
    assert value(prom.query(panel_query("OOM-risk nodes"))[0]) == 1
    assert value(prom.query(panel_query("Nodes", "A"))[0]) == 6
    assert value(prom.query(panel_query("Nodes", "B"))[0]) == 0


def test_fleet_heat_maps_show_the_outliers(fleet: Lab) -> None:
    """The hottest row of each heat map is an unhealthy node, over the last seconds."""
    prom = fleet.prom
    now = time.time()

    def hottest(title: str) -> str:
        series = prom.query_range(panel_query(title), start=now - 5, end=now, step=1)
        assert {s["metric"]["node"] for s in series} == set(FLEET)
        return max(series, key=lambda s: float(s["values"][-1][1]))["metric"]["node"]

    assert hottest("SM active by node") == "node-5"
    assert hottest("Memory used by node") == "node-6"


def test_fleet_tokens_per_model(fleet: Lab) -> None:
    result = fleet.prom.query(panel_query("Generated tokens/s per model"))
    models = {r["metric"]["model"]: value(r) for r in result}
    assert set(models) == {"meta-llama/Llama-3.1-70B-Instruct", "Qwen/Qwen2.5-14B-Instruct"}
    assert all(v > 0 for v in models.values())


def test_every_rule_evaluates_cleanly(fleet: Lab) -> None:
    """No recording or alert rule errors on the real series (many-to-many joins, bad types)."""
    bad = [(name, err) for name, health, err in fleet.prom.rule_health() if health != "ok"]
    assert bad == []


def test_every_recording_rule_has_data(fleet: Lab) -> None:
    import yaml
    from conftest import RULE_FILES

    records = [
        r["record"]
        for path in RULE_FILES
        for g in yaml.safe_load(path.read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    ]
    empty = [name for name in records if not fleet.prom.query(name)]
    assert empty == []
