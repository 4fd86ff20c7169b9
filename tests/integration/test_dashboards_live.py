"""Every dashboard query returns data from a real Prometheus scraping the simulated exporters.

Each query names the scenarios in which it must have data (dashboards/common.py `q()`);
it is run with the dashboard variables set to that scenario's node, the way Grafana
would send it: range queries over the whole run, instant (table) queries at its end.
"""

from __future__ import annotations

import time

import pytest
from conftest import FLEET, LAB, Lab, expand

from dashboards import generate
from dashboards.common import Query, queries

pytestmark = pytest.mark.integration

BOARDS = {path.name.removesuffix(".dashboard.py"): board for path, board in generate.boards().items()}
IN_LAB = set(FLEET.values()) | set(LAB.values())
CASES = [
    pytest.param(name, title, query, scenario, id=f"{name}/{title}/{query.refId}/{scenario}")
    for name, board in sorted(BOARDS.items())
    for title, query in queries(board)
    for scenario in query.scenarios
]
CASES_LAB = [c for c in CASES if c.values[3] in IN_LAB]
CASES_LAB2 = [c for c in CASES if c.values[3] not in IN_LAB]
SETTLE_S = 22.0  # every scenario has reached its last phase (at most 14 s) and rates have data


def settle(lab: Lab) -> Lab:
    time.sleep(max(0.0, lab.started + SETTLE_S - time.time()))
    return lab


@pytest.fixture(scope="module")
def settled(lab: Lab) -> Lab:
    return settle(lab)


@pytest.fixture(scope="module")
def settled2(lab2: Lab) -> Lab:
    return settle(lab2)


def variables(lab: Lab, scenario: str) -> dict[str, str]:
    node = lab.node_of(scenario)
    elapsed = int(time.time() - lab.started)
    return {
        "cluster": lab.cluster_of(node),
        "node": lab.instance(node),
        "gpu": ".*",
        "namespace": ".*",
        "model": ".*",
        "target": ".*",
        "layer": ".*",
        "__rate_interval": "5s",
        "__interval": "1s",
        "__range": f"{elapsed}s",
    }


def check_query(lab: Lab, board: str, title: str, query: Query, scenario: str) -> None:
    expr = expand(query.expr, variables(lab, scenario))
    now = time.time()
    if query.instant:
        result = lab.prom.query(expr, at=now)
    else:
        result = lab.prom.query_range(expr, start=lab.started, end=now, step=1)
    assert result, f"{board} / {title}: no data for {scenario} from\n{expr}"


@pytest.mark.parametrize(("board", "title", "query", "scenario"), CASES_LAB)
def test_query_has_data(settled: Lab, board: str, title: str, query: Query, scenario: str) -> None:
    check_query(settled, board, title, query, scenario)


@pytest.mark.parametrize(("board", "title", "query", "scenario"), CASES_LAB2)
def test_query_has_data_in_more_scenarios(
    settled2: Lab, board: str, title: str, query: Query, scenario: str
) -> None:
    check_query(settled2, board, title, query, scenario)


def test_variables_resolve(settled: Lab) -> None:
    """The variable queries give the clusters, nodes, GPUs, models and targets there are."""
    prom = settled.prom
    assert set(prom.label_values("cluster", "llmgpu_exporter_build_info")) == {"fleet", "lab"}
    nodes = prom.label_values("instance", 'llmgpu_exporter_build_info{cluster=~"fleet"}')
    assert sorted(nodes) == sorted(settled.instance(n) for n, v in settled.nodes.items() if v[0] == "fleet")
    healthy = settled.instance("node-1")
    gpus = prom.label_values("gpu", f'llmgpu_gpu_info{{cluster=~".*", instance=~"{healthy}"}}')
    assert sorted(gpus, key=int) == [str(i) for i in range(8)]
    models = prom.label_values("model", f'llmgpu_engine_up{{cluster=~".*", instance=~"{healthy}"}}')
    assert models == ["meta-llama/Llama-3.1-70B-Instruct"]
    targets = prom.label_values("target", f'llmgpu_engine_up{{instance=~"{healthy}", model=~".*"}}')
    assert len(targets) == 1


# Panels with a query no scenario feeds (dashboards/common.py PROBE_ONLY, NOT_SIMULATED).
UNCHECKED = {
    ("diagnosis", "Evidence: allocator fragmentation (memory/allocator_fragmentation)"),
    ("diagnosis", "Evidence: memory faults (memory/xid_memory_fault)"),
    ("node", "Allocator: reserved, allocated, largest free block"),
    ("node", "Allocator fragmentation and retries"),
    ("node", "NVLink errors"),
    # no lab scenario configures a price, restarts an engine or plays slowly enough for two
    # engine scrapes to fall inside the minute energy per token is taken over
    ("engine", "Cost per million tokens"),
    ("engine", "Last downtime"),
    ("engine", "Energy per generated token"),
    ("diagnosis", "Evidence: engine restarts (capacity/slow_recovery)"),
}


def test_unchecked_queries_are_known() -> None:
    """A query left out of the live checks is a decision written down here, not an accident."""
    unchecked = {
        (name, title) for name, board in BOARDS.items() for title, q in queries(board) if not q.scenarios
    }
    assert unchecked == UNCHECKED


def test_queries_counted() -> None:
    """The number of checks above, for the record: panels x queries x scenarios."""
    panels = {(name, title) for name, board in BOARDS.items() for title, _ in queries(board)}
    assert len(panels) >= 60
    assert len(CASES) >= 150
