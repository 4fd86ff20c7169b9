"""Blind spots said out loud: which rules cannot run on which GPU, and why.

A rule built on a profiling signal (SM active, tensor active, DRAM bandwidth) says
nothing when the signal is absent, and silence reads like health. NVML's GPM gives
those signals on Hopper and later only; older data-center parts get them from DCGM's
profiling module through a co-located dcgm-exporter. Where neither gives a signal, the
report names each rule left blind on each GPU, the reason, and what would fix it, in
the diagnosis JSON (`blind_spots`), on the page, and as `llmgpu_diagnosis_rule_blind`.
No rule falls back to NVML's memory-busy ratio for DRAM bandwidth: that ratio is the
time memory was read or written at all, not how much of the bandwidth was used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from exporter.dcgm.status import DcgmExporters, DcgmExporterTarget
from exporter.diagnosis.frame import Frame, GpuFrame
from exporter.gpu_specs import spec_of
from exporter.metricdef import gauge, label, nested
from exporter.snapshot import Snapshot


@dataclass(frozen=True)
class Signal:
    name: str  # as a person says it
    get: Callable[[GpuFrame], float | None]
    dcgm_field: str  # the dcgm-exporter counter that provides it


SIGNALS: Mapping[str, Signal] = {
    "sm_active": Signal("SM-active", lambda g: g.sm_active_ratio, "DCGM_FI_PROF_SM_ACTIVE"),
    "tensor_active": Signal(
        "tensor-active", lambda g: g.tensor_active_ratio, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
    ),
    "dram_active": Signal("DRAM-bandwidth", lambda g: g.dram_active_ratio, "DCGM_FI_PROF_DRAM_ACTIVE"),
}
# The rules that read a profiling signal, and which (tests/unit/test_dcgm_coverage.py
# checks each goes quiet without it).
RULE_SIGNALS: Mapping[str, tuple[str, ...]] = {
    "hardware/busy_idle_sms": ("sm_active",),
    "hardware/dram_bandwidth_bound": ("dram_active",),
    "kernel/low_tensor_activity": ("sm_active", "tensor_active"),
    "parallel/sm_imbalance": ("sm_active",),
    "capacity/sm_saturation": ("sm_active",),
}


@dataclass(frozen=True)
class BlindSpot:
    rule: str
    gpu: str
    uuid: str
    gpu_name: str
    signal: str
    reason: str
    fix: str

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "gpu": self.gpu,
            "uuid": self.uuid,
            "gpu_name": self.gpu_name,
            "signal": self.signal,
            "reason": self.reason,
            "fix": self.fix,
        }


@dataclass(frozen=True)
class RuleBlind:
    rule: str = label()
    gpu: str = label()
    signal: str = label()
    blind: int | None = gauge(
        "llmgpu_diagnosis_rule_blind",
        "1 while the rule cannot run on the GPU for want of the signal (neither NVML GPM nor a "
        "dcgm-exporter gives it); the reason is under blind_spots in /api/v1/diagnosis",
    )


@dataclass(frozen=True)
class RuleBlindness:
    """Every rule x GPU x signal that is blind now: a node reading."""

    items: tuple[RuleBlind, ...] = nested(RuleBlind)


def _why(g: GpuFrame, signal: Signal, dcgm: Sequence[DcgmExporterTarget]) -> tuple[str, str]:
    """(reason, fix) for a signal a GPU lacks."""
    name = g.name or "this GPU"
    lack = f"no {signal.name} signal on {name}"
    spec = spec_of(g.name)
    deploy = (
        f"deploy dcgm-exporter with profiling metrics ({signal.dcgm_field} in its counters CSV) on this "
        "node, or point --dcgm-exporter at it"
    )
    if g.mig_enabled:
        return (
            f"{lack}: MIG is on, and profiling counters exist per GPU instance only",
            "read them per instance from dcgm-exporter (GPU_I_ID) until whole-GPU profiling returns",
        )
    up = [t for t in dcgm if t.up]
    if not dcgm:
        gpm = "NVML GPM gave none yet" if spec is not None and spec.gpm else "NVML GPM needs Hopper or later"
        return f"{lack}: {gpm}, and no dcgm-exporter is read", deploy
    if not up:
        t = dcgm[0]
        return (
            f"{lack}: the dcgm-exporter at {t.target} is down ({t.last_error or 'no answer'})",
            f"bring the dcgm-exporter at {t.target} back, or {deploy}",
        )
    t = up[0]
    if g.uuid in t.stale:
        return (
            f"{lack}: the dcgm-exporter at {t.target} serves stale values for it",
            "check DCGM's host engine and that profiling is not paused or taken by another profiler",
        )
    if g.uuid not in t.listed:
        return (
            f"{lack}: the dcgm-exporter at {t.target} does not list GPU {g.uuid}",
            "point --dcgm-exporter at the dcgm-exporter of this node",
        )
    if signal.dcgm_field not in t.fields:
        return (
            f"{lack}: the dcgm-exporter at {t.target} does not export {signal.dcgm_field}",
            f"enable {signal.dcgm_field} in its counters CSV (-f / --collectors)",
        )
    return (
        f"{lack}: the dcgm-exporter at {t.target} gives no value for it",
        "check that DCGM's profiling module supports this GPU (dcgmi profile --list)",
    )


def blind_spots(frame: Frame, dcgm: Sequence[DcgmExporterTarget] = ()) -> tuple[BlindSpot, ...]:
    out = []
    for g in frame.gpus:
        if not g.up:
            continue  # a lost GPU is its own finding
        missing = {key: s for key, s in SIGNALS.items() if s.get(g) is None}
        if not missing:
            continue
        reasons = {key: _why(g, s, dcgm) for key, s in missing.items()}
        for rule, needs in RULE_SIGNALS.items():
            for key in needs:
                if key in missing:
                    reason, fix = reasons[key]
                    out.append(BlindSpot(rule, str(g.index), g.uuid, g.name, key, reason, fix))
    return tuple(out)


def report(frame: Frame, snapshot: Snapshot) -> tuple[tuple[BlindSpot, ...], RuleBlindness]:
    """The blind spots of a snapshot, and the reading that exports them."""
    dcgm = [t for r in snapshot.all(DcgmExporters) for t in r.targets]
    spots = blind_spots(frame, dcgm)
    return spots, RuleBlindness(tuple(RuleBlind(s.rule, s.gpu, s.signal, 1) for s in spots))


def page_section(spots: Iterable[Mapping[str, Any]]) -> str:
    """The page's "Blind spots" panel: per GPU and reason, the rules that cannot run."""
    grouped: dict[tuple[str, str, str, str], list[str]] = {}
    for s in spots:
        key = (str(s.get("gpu")), str(s.get("gpu_name") or ""), str(s.get("reason")), str(s.get("fix")))
        rules = grouped.setdefault(key, [])
        if str(s.get("rule")) not in rules:
            rules.append(str(s.get("rule")))
    if not grouped:
        return ""
    rows = []
    for (gpu, _name, reason, fix), rules in sorted(
        grouped.items(), key=lambda kv: (kv[0][0].zfill(4), kv[0][2])
    ):
        codes = " ".join(f"<code>{escape(r)}</code>" for r in rules)
        rows.append(
            f"<div class='blind' style='margin:6px 0' data-blind-gpu='{escape(gpu)}'>"
            f"<b>GPU {escape(gpu)}</b>: {escape(reason)}."
            f"<div class='ev'>cannot run: {codes}</div>"
            f"<div class='advice'><b>Fix:</b> {escape(fix)}.</div></div>"
        )
    return "<h2>Blind spots</h2><div class='panel' id='blind-spots'>" + "".join(rows) + "</div>"
