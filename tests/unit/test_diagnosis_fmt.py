"""Numbers as text: one rounding for every ratio, identifiers as themselves."""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.diagnosis.diagnoser import Diagnoser
from exporter.diagnosis.fmt import value_text
from exporter.diagnosis.frame import AllocFrame
from exporter.diagnosis.report import render_text
from tests.support.diagnosis_builders import GIB, engine, frame, gpu


def test_a_pid_reads_as_a_pid() -> None:
    assert value_text(4_000_000, "id") == "4000000"
    assert value_text(3, "id") == "3"


def test_ratios_never_round_to_a_full_or_empty_claim() -> None:
    assert value_text(0.997, "ratio") == "99.7 %"
    assert value_text(0.9996, "ratio") == "100.0 %"
    assert value_text(1.0, "ratio") == "100 %"
    assert value_text(0.93, "ratio") == "93 %"
    assert value_text(0.0004, "ratio") == "0.0 %"
    assert value_text(0.0, "ratio") == "0 %"
    assert value_text(0.05, "ratio") == "5.0 %"


def test_score_and_evidence_read_the_same() -> None:
    # beyond budget (7.9 of 8 GiB spare used), low headroom, sharing, fragmentation:
    # 1 - 0.0125 * 0.7 * 0.7 * 0.5 = 0.99694, which used to read 100 % in the evidence
    a = AllocFrame(
        pid=4_000_000, free_bytes=6 * GIB, largest_free_block_bytes=64 * 1024**2, fragmentation_ratio=0.9
    )
    g = replace(gpu(0), memory_used_bytes=79.9 * GIB, process_count=2, allocators=(a,))
    e = engine(gpus=(0,), pids=frozenset({4_000_000}), gpu_memory_utilization=0.9)
    d = Diagnoser()
    for t in range(0, 130, 10):
        _, _, diagnosis = d.step(frame(float(t), (g,), (e,)))
    risk = diagnosis.oom_risks[0]
    assert risk.ratio == pytest.approx(0.9969, abs=1e-4)
    finding = next(f for f in diagnosis.findings if f.id == "memory/oom_risk")
    shown = next(x for x in finding.evidence if x.name.startswith("OOM risk"))
    assert value_text(shown.value, shown.unit) == value_text(risk.ratio, "ratio") == "99.7 %"
    text = render_text(diagnosis.to_json())
    assert "99.7 %" in text and text.count("100 %") == text.count("(0-100 %)")
    frag = next(f for f in diagnosis.findings if f.id == "memory/allocator_fragmentation")
    pid = next(x for x in frag.evidence if "pid" in x.name)
    assert value_text(pid.value, pid.unit) == "4000000"
    assert "pid 4000000" in text and " 4.0 M" not in text
