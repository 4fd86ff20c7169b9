"""Engine scenario keys that feed rules: FLOP and byte estimates, CPU NUMA nodes."""

from __future__ import annotations

import pytest

from exporter.engines.targets import parse_spec
from exporter.sim.engines import start_sim_engines
from exporter.sim.scenario import ScenarioError, Timeline, parse


def scenario(engine: dict[str, object], values: dict[str, float]) -> dict[str, object]:
    return {
        "gpus": {"count": 2},
        "engines": [{"name": "e", "gpus": [0], **engine}],
        "phases": [{"name": "p", "duration": 600, "engine": {"gen_tps": 100, **values}}],
    }


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_estimates_are_counters_of_the_rates_and_absent_unless_set() -> None:
    (e,) = start_sim_engines(
        Timeline(parse(scenario({}, {"flops_per_gpu": 2e13, "read_bytes_per_gpu": 1e11})), clock=Clock())
    )
    (plain,) = start_sim_engines(Timeline(parse(scenario({}, {})), clock=Clock()))
    try:
        page = e.render(100.0)
        values = {
            line.split("{", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in page.splitlines()
            if line.startswith("vllm:estimated_")
        }
        assert values["vllm:estimated_flops_per_gpu_total"] == pytest.approx(2e15)
        assert values["vllm:estimated_read_bytes_per_gpu_total"] == pytest.approx(1e13)
        assert "estimated_flops" not in plain.render(100.0)
    finally:
        e.stop()
        plain.stop()


def test_cpu_numa_nodes_ride_in_the_target_spec() -> None:
    (e,) = start_sim_engines(Timeline(parse(scenario({"cpu_numa_nodes": [1]}, {})), clock=Clock()))
    (plain,) = start_sim_engines(Timeline(parse(scenario({}, {})), clock=Clock()))
    try:
        assert parse_spec(e.target_spec).numa_nodes == (1,)
        assert parse_spec(plain.target_spec).numa_nodes is None
    finally:
        e.stop()
        plain.stop()


@pytest.mark.parametrize("bad", [[], "1", [-1], [0.5]])
def test_cpu_numa_nodes_must_be_node_numbers(bad: object) -> None:
    with pytest.raises(ScenarioError, match=r"engines\.e\.cpu_numa_nodes"):
        parse(scenario({"cpu_numa_nodes": bad}, {}))
