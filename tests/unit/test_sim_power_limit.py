"""The enforced power limit is a scenario value: the fake answers it, draws power and
counts energy against it, and keeps the part's settable range."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors import base
from exporter.config import Settings
from exporter.sim import fakenvml, node
from exporter.sim.scenario import ScenarioError, Timeline, builtin_names, load_builtin, parse

pytestmark = pytest.mark.slow  # plays scenarios or starts servers: `make unit` leaves it out

POWER_ONLY = tuple(name for name in base.REGISTRY if name not in ("power", "device"))


def exported(name: str, step_s: float = 10.0) -> Iterator[tuple[float, dict[str, dict[str, float]]]]:
    """(scenario time, metric -> gpu -> value) of each cycle of a shipped scenario."""
    scenario = load_builtin(name)
    clock = node.ManualClock()
    settings = Settings(simulate=name, collectors_disabled=POWER_ONLY, metric_profile="full")
    exporter = node.build(settings, clock)
    try:
        for i in range(int(scenario.duration // step_s) + 1):
            clock.t = i * step_s
            exporter.step()
            assert exporter.runner.published is not None
            values: dict[str, dict[str, float]] = {}
            for fam in text_string_to_metric_families(exporter.runner.published.text.decode()):
                for s in fam.samples:
                    if s.name.startswith("llmgpu_gpu_power") or s.name == "llmgpu_gpu_energy_joules_total":
                        values.setdefault(s.name, {})[s.labels["gpu"]] = s.value
            yield clock.t, values
    finally:
        exporter.close()


def test_power_capped_reports_its_450_w_limit_and_draws_under_it() -> None:
    played = list(exported("power-capped"))
    gpus = {str(i) for i in range(8)}
    for t, v in played:
        limit, draw = v["llmgpu_gpu_power_limit_watts"], v["llmgpu_gpu_power_watts"]
        assert set(limit) == set(draw) == gpus
        assert all(draw[g] <= limit[g] for g in gpus), f"draw over the limit at t={t}: {draw} > {limit}"
        assert v["llmgpu_gpu_power_limit_max_watts"] == dict.fromkeys(gpus, 700.0)  # the part's range
    capped = [v for t, v in played if t >= 160]  # the cap set and the collector's hold past
    assert capped and all(v["llmgpu_gpu_power_limit_watts"] == dict.fromkeys(gpus, 450.0) for v in capped)
    assert all(400 < w <= 450 for v in capped for w in v["llmgpu_gpu_power_watts"].values())
    before = [v for t, v in played if t < 120]
    assert all(v["llmgpu_gpu_power_limit_watts"] == dict.fromkeys(gpus, 700.0) for v in before)
    # the energy counter counts that draw: its rate over the capped phase is the mean draw
    first, last = capped[0]["llmgpu_gpu_energy_joules_total"], capped[-1]["llmgpu_gpu_energy_joules_total"]
    seconds = 10.0 * (len(capped) - 1)
    for g in gpus:
        mean = sum(v["llmgpu_gpu_power_watts"][g] for v in capped) / len(capped)
        assert (last[g] - first[g]) / seconds == pytest.approx(mean, rel=0.02)


def scenario(gpu: dict[str, object], model: str = "H100-80GB-SXM") -> Timeline:
    return Timeline(
        parse(
            {
                "gpus": {"count": 1, "model": model},
                "phases": [
                    {"name": "full", "duration": 100, "gpu": {"power_ratio": 0.8}},
                    {"name": "capped", "duration": 100, "ramp": 10, "gpu": gpu},
                ],
            }
        ),
        clock=lambda: 0.0,
    )


def test_the_energy_counter_integrates_the_draw_across_a_limit_change() -> None:
    timeline = scenario({"power_ratio": 0.9, "power_limit_watts": 300})
    ratio = timeline.gpu(0, "power_ratio", 150)
    assert ratio == 0.9 and timeline.gpu(0, "power_limit_watts", 150) == 300
    # 100 s at 0.8 x 700 W, a 10 s ramp of both, then 90 s at 0.9 x 300 W; over the ramp
    # (0.8 + 0.1 x)(700 - 400 x) integrates to 560 + (70 - 320) / 2 - 40 / 3 per unit of x
    expected = 100 * 560 + 10 * (560 - 125 - 40 / 3) + 90 * 270
    assert timeline.gpu_integral_of_product(0, "power_ratio", "power_limit_watts", 200) == pytest.approx(
        expected, rel=1e-9
    )


def test_nvml_answers_the_scenario_limit_and_keeps_the_part_range() -> None:
    timeline = scenario({"power_limit_watts": 30}, model="L4")
    lib = fakenvml.install(timeline)
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        before = lib.calls
        assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == 72000  # at t=0: the L4's own
        timeline._clock = lambda: 150.0  # type: ignore[method-assign]
        assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == 30000
        assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 30000
        assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h) == [21600, 72000]
        assert pynvml.nvmlDeviceGetPowerUsage(h) == pytest.approx(0.8 * 30000, rel=0.02)
        assert lib.calls - before == 5  # one answer per call, none through another
    finally:
        fakenvml.uninstall()


@pytest.mark.parametrize("watts", [800, 100])
def test_a_limit_the_part_cannot_be_set_to_is_refused_by_name(watts: int) -> None:
    with pytest.raises(ScenarioError, match=r"phases\.capped\.gpu\.power_limit_watts.*210 to 700 W.*H100"):
        scenario({"power_limit_watts": watts})


@pytest.mark.parametrize("name", builtin_names())
def test_no_shipped_scenario_draws_over_its_limit(name: str) -> None:
    # the fake's wobble is +-1.5 % (abi.noise): a ratio above 1/1.015 would cross the limit
    for phase in load_builtin(name).phases:
        for values in (phase.gpu, *phase.gpus.values()):
            assert values.get("power_ratio", 0.0) * 1.015 <= 1.0, f"{name}: {phase.name}"
