"""A NaN from nvmlGpmMetricsGet is a blank (DCGM's DcgmGpmManager.cpp turns it into
DCGM_FP64_BLANK): never exported, and never in place of a dcgm-exporter's good value."""

from __future__ import annotations

import math

import pytest

from exporter.gpu_readings import MetricSources, Profiling

SCENARIO = """
name: t
gpus: {count: 2, model: H100-80GB-SXM}
dcgm_exporter: {}
phases:
  - name: p
    duration: 1000
    gpu: {util: 0.8, sm_active: 0.6, sm_occupancy: 0.3, tensor_active: 0.4, dram_active: 0.5}
    gpus: {1: {gpm_nan: 1}}
"""


def test_a_nan_never_replaces_a_good_value_nor_reaches_metrics(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(SCENARIO, metrics_enabled=("llmgpu_gpu_metric_source",))
    for t in range(1, 20):
        snap = s.at(t * 5.0)
    good, nan = snap.gpu(0).get(Profiling), snap.gpu(1).get(Profiling)
    assert good is not None and nan is not None
    for p in (good, nan):
        assert all(not (isinstance(v, float) and math.isnan(v)) for v in vars(p).values())
    # GPU 1's GPM answered NaN for SM activity: the dcgm-exporter's value stands, and says so
    assert nan.sm_active_ratio == pytest.approx(0.6, rel=0.05)
    assert nan.tensor_active_ratio == pytest.approx(0.4, rel=0.05)
    sources = {i.metric: i.source for i in snap.gpu(1).get(MetricSources).items}
    assert sources["llmgpu_gpu_sm_active_ratio"] == "dcgm"
    assert sources["llmgpu_gpu_tensor_active_ratio"] == "gpm"
    assert {i.metric: i.source for i in snap.gpu(0).get(MetricSources).items}[
        "llmgpu_gpu_sm_active_ratio"
    ] == "gpm"
    text = s.text()
    assert "NaN" not in text
    assert 'llmgpu_gpu_sm_active_ratio{gpu="1"' in text


def test_without_another_source_the_metric_is_absent(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(SCENARIO.replace("dcgm_exporter: {}\n", ""))
    s.at(1)
    snap = s.at(2)
    p = snap.gpu(1).get(Profiling)
    assert p.sm_active_ratio is None and p.sm_occupancy_ratio is None  # a blank, not a value
    assert p.tensor_active_ratio == pytest.approx(0.4, rel=0.05)  # the other metrics stay
    assert snap.gpu(0).get(Profiling).sm_active_ratio == pytest.approx(0.6, rel=0.05)
    text = s.text()
    assert "NaN" not in text and 'llmgpu_gpu_sm_active_ratio{gpu="1"' not in text
    # a blank on one run is not a metric the GPU lacks: it comes back with the next answer
    assert snap.gpu(1).supported["gpm"] is True
