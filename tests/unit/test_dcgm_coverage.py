"""The blind-spot report: each rule built on a profiling signal, and why it cannot run."""

from __future__ import annotations

import inspect
import re
from dataclasses import replace
from typing import Any

import pytest

from exporter.dcgm.status import DcgmExporterTarget
from exporter.diagnosis.coverage import RULE_SIGNALS, SIGNALS, blind_spots, page_section
from exporter.diagnosis.frame import Frame
from exporter.diagnosis.rules import RULES, RULES_BY_ID
from exporter.web.page import render_page
from tests.support.diagnosis_builders import engine, frame, gpu, run_rule

A100 = "NVIDIA A100-SXM4-80GB"
# a frame on which each profiling rule fires
FIRING: dict[str, Frame] = {
    "hardware/busy_idle_sms": frame(0, (gpu(0, util_ratio=0.99, sm_active_ratio=0.05),)),
    "hardware/dram_bandwidth_bound": frame(0, (gpu(0, dram_active_ratio=0.99),)),
    "kernel/low_tensor_activity": frame(0, (gpu(0, sm_active_ratio=0.9, tensor_active_ratio=0.0),)),
    "parallel/sm_imbalance": frame(
        0, (gpu(0, sm_active_ratio=0.9), gpu(1, sm_active_ratio=0.2)), (engine(gpus=(0, 1)),)
    ),
    "capacity/sm_saturation": frame(0, (gpu(0, sm_active_ratio=0.999),)),
}


def without(f: Frame, signal: str) -> Frame:
    return replace(f, gpus=tuple(replace(g, **{f"{signal}_ratio": None}) for g in f.gpus))


def test_the_table_names_every_rule_that_reads_a_profiling_signal() -> None:
    reads = {}
    for r in RULES:
        source = inspect.getsource(r.check)
        found = set(re.findall(r"\b(sm_active|tensor_active|dram_active)_ratio\b", source))
        if found:
            reads[r.id] = found
    assert set(reads) == set(RULE_SIGNALS)
    for rule, needs in RULE_SIGNALS.items():
        assert set(needs) <= reads[rule] and set(needs) <= set(SIGNALS)


@pytest.mark.parametrize(("rule", "signal"), [(r, s) for r, needs in RULE_SIGNALS.items() for s in needs])
def test_each_rule_goes_quiet_without_its_signal(rule: str, signal: str) -> None:
    r = RULES_BY_ID[rule]
    assert run_rule(r, [FIRING[rule]]), "fires with the signal"
    assert run_rule(r, [without(FIRING[rule], signal)]) == [], "silent without it: a blind spot"


def blind_gpu(**kw: Any) -> Frame:
    base = dict(name=A100, sm_active_ratio=None, tensor_active_ratio=None, dram_active_ratio=None)
    return frame(0, (gpu(0, **{**base, **kw}),))


def dcgm(**kw: Any) -> DcgmExporterTarget:
    base: dict[str, Any] = dict(target="http://10.1.0.9:9400/metrics", source="kubernetes", up=1)
    return DcgmExporterTarget(**{**base, **kw})


def reason(f: Frame, targets: tuple[DcgmExporterTarget, ...], rule: str) -> tuple[str, str]:
    spot = next(s for s in blind_spots(f, targets) if s.rule == rule)
    return spot.reason, spot.fix


def test_every_blind_rule_is_listed_once_per_missing_signal() -> None:
    spots = blind_spots(blind_gpu())
    assert sorted((s.rule, s.signal) for s in spots) == sorted(
        (r, s) for r, needs in RULE_SIGNALS.items() for s in needs
    )
    assert {s.gpu for s in spots} == {"0"} and {s.uuid for s in spots} == {"GPU-0000"}


def test_a_gpu_with_its_signals_or_down_has_no_blind_spot() -> None:
    assert blind_spots(frame(0, (gpu(0),))) == ()
    assert blind_spots(frame(0, (replace(blind_gpu().gpus[0], up=False),))) == ()
    only_dram = blind_spots(blind_gpu(sm_active_ratio=0.5, tensor_active_ratio=0.4))
    assert {s.rule for s in only_dram} == {"hardware/dram_bandwidth_bound"}


def test_the_reasons_say_what_is_missing_and_the_fix() -> None:
    r = "hardware/dram_bandwidth_bound"
    why, fix = reason(blind_gpu(), (), r)
    assert why == (
        f"no DRAM-bandwidth signal on {A100}: NVML GPM needs Hopper or later, and no dcgm-exporter is read"
    )
    assert "deploy dcgm-exporter" in fix and "DCGM_FI_PROF_DRAM_ACTIVE" in fix
    why, _ = reason(blind_gpu(name="NVIDIA H100 80GB HBM3"), (), r)
    assert "NVML GPM gave none yet" in why
    why, fix = reason(blind_gpu(), (dcgm(up=0, last_error="timeout: no complete answer within 3 s"),), r)
    assert "is down (timeout" in why and "http://10.1.0.9:9400/metrics" in fix
    why, _ = reason(blind_gpu(), (dcgm(listed=frozenset({"GPU-other"})),), r)
    assert "does not list GPU GPU-0000" in why
    why, _ = reason(blind_gpu(), (dcgm(listed=frozenset({"GPU-0000"}), stale=frozenset({"GPU-0000"})),), r)
    assert "stale" in why
    listed = dcgm(listed=frozenset({"GPU-0000"}), fields=frozenset({"DCGM_FI_PROF_DRAM_ACTIVE"}))
    why, fix = reason(blind_gpu(), (listed,), "capacity/sm_saturation")
    assert "does not export DCGM_FI_PROF_SM_ACTIVE" in why and "counters CSV" in fix
    why, _ = reason(blind_gpu(mig_enabled=True), (), r)
    assert "MIG is on" in why


def test_the_page_groups_blind_rules_per_gpu_and_reason() -> None:
    spots = [s.to_json() for s in blind_spots(blind_gpu())]
    html = page_section(spots)
    assert html.count("data-blind-gpu='0'") == 3  # one line per missing signal
    assert "<code>hardware/dram_bandwidth_bound</code>" in html and "Fix:" in html
    assert page_section([]) == ""
    page = render_page({"status": "ok", "summary": {}, "findings": [], "blind_spots": spots})
    assert "id='blind-spots'" in page
    assert "id='blind-spots'" not in render_page({"status": "ok", "summary": {}, "findings": []})
