"""A scenario may not set a value its GPUs could not report: it is refused at load, by name."""

from __future__ import annotations

import pytest

from exporter.sim.drivers import profile
from exporter.sim.scenario import (
    MODELS,
    NVLINK_KEYS,
    PROFILING_KEYS,
    ScenarioError,
    builtin_names,
    load_builtin,
    parse,
    unprovided_keys,
)


def scenario(model: str, values: dict[str, float], per_gpu: bool = False, driver: str | None = None) -> dict:
    gpus: dict[str, object] = {"count": 2, "model": model}
    if driver:
        gpus["driver"] = driver
    phase: dict[str, object] = {"name": "busy", "duration": 60}
    phase["gpus" if per_gpu else "gpu"] = {1: values} if per_gpu else values
    return {"gpus": gpus, "phases": [{"name": "calm", "duration": 60}, phase]}


@pytest.mark.parametrize("key", PROFILING_KEYS)
def test_profiling_keys_on_a_gpu_without_gpm_are_refused_naming_key_phase_and_model(key: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse(scenario("A100-80GB-SXM", {key: 0.5}), source="a100.yaml")
    text = str(err.value)
    assert f"phases.busy.gpu.{key}" in text and "A100-SXM4-80GB" in text and "GPM" in text
    assert text.startswith("a100.yaml:")


def test_a_single_gpus_value_is_refused_too_and_says_which_gpu() -> None:
    with pytest.raises(ScenarioError, match=r"phases\.busy\.gpus\.1\.tensor_active.*NVIDIA L4"):
        parse(scenario("L4", {"tensor_active": 0.3}, per_gpu=True))


def test_nvlink_on_a_pcie_part_and_gpm_on_an_old_driver_are_refused() -> None:
    with pytest.raises(ScenarioError, match=r"nvlink_tx_bps.*no NVLink"):
        parse(scenario("L40S", {"nvlink_tx_bps": 1e10}))
    with pytest.raises(ScenarioError, match=r"sm_active.*driver R470 has no GPM"):
        parse(scenario("H100-80GB-SXM", {"sm_active": 0.5}, driver="R470"))
    with pytest.raises(ScenarioError, match=r"ecc_uncorrected_rate.*no ECC"):
        parse(scenario("RTX-4090", {"ecc_uncorrected_rate": 0.1}))
    with pytest.raises(ScenarioError, match=r"mem_temp_c.*no memory temperature"):
        parse(scenario("RTX-4090", {"mem_temp_c": 70}))


def test_what_the_profile_provides_is_accepted() -> None:
    parse(scenario("H100-80GB-SXM", {k: 0.5 for k in (*PROFILING_KEYS, *NVLINK_KEYS)}))
    parse(scenario("A100-80GB-SXM", {"util": 0.9, "nvlink_tx_bps": 1e10, "mem_temp_c": 60}))
    parse(scenario("L4", {"util": 0.9, "mem_temp_c": 60, "ecc_corrected_rate": 0.1}))


def test_a_profiling_source_provides_the_profiling_keys() -> None:
    a100 = MODELS["A100-80GB-SXM"]
    assert set(PROFILING_KEYS) <= set(unprovided_keys(a100, profile("A100-80GB-SXM")))
    assert not set(PROFILING_KEYS) & set(
        unprovided_keys(a100, profile("A100-80GB-SXM"), profiling_source=True)
    )


@pytest.mark.parametrize("name", builtin_names())
def test_every_shipped_scenario_sets_only_what_its_gpus_report(name: str) -> None:
    load_builtin(name)  # raises on a key the model cannot provide
