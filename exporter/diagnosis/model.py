"""What the diagnosis produces: rules, findings, OOM risk, and the readings that export them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from exporter.metricdef import gauge, label, nested

if TYPE_CHECKING:
    from exporter.diagnosis.frame import Frame
    from exporter.diagnosis.history import History
    from exporter.diagnosis.thresholds import Thresholds

LAYERS = ("hardware", "kernel", "memory", "scheduling", "parallel", "decoding", "capacity")
SEVERITIES = ("critical", "warning", "info")
Scope = Literal["gpu", "engine", "gpu_engine"]
Unit = Literal[
    "ratio",
    "bytes",
    "seconds",
    "per_second",
    "bytes_per_second",
    "celsius",
    "watts",
    "joules",
    "count",
    "id",
    "",
]


@dataclass(frozen=True)
class Subject:
    """What a finding is about. `gpu` and `target` are "" where not applicable."""

    gpu: str = ""
    target: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.gpu, self.target)


@dataclass(frozen=True)
class Evidence:
    """One number that made a rule fire, with the threshold it was compared to."""

    name: str
    value: float | str | None
    unit: Unit = ""
    threshold: str = ""  # e.g. "> 0.95", shown beside the value


@dataclass(frozen=True)
class Candidate:
    """A rule's condition holding for one subject in the current frame."""

    subject: Subject
    evidence: tuple[Evidence, ...] = ()
    detail: str = ""  # one line naming what was seen, e.g. "GPU 3 at 91 °C, sw_thermal"
    advice: str = ""  # advice that follows this evidence; "" means the rule's own line


Check = Callable[["Frame", "History", "Thresholds"], Iterable[Candidate]]


@dataclass(frozen=True)
class Rule:
    """A rule as `@rule(...)` declares it (exporter/diagnosis/rules/)."""

    id: str  # "<layer>/<name>"
    severity: str
    scope: Scope
    title: str  # what the finding says, one short line
    condition: str  # the condition in words, with the thresholds' names
    advice: str  # one line: what to do
    check: Check
    hold_s: str | float  # seconds, or the name of the Thresholds field holding them
    clear_s: str | float
    window_s: str | float = 0.0  # the longest window its rates and quantiles are taken over
    gpus_without_engine: bool = False  # gpu_engine scope: GPUs no engine runs on are subjects too

    layer: str = field(init=False, repr=False, compare=False)
    name: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        layer, name = self.id.split("/", 1)
        object.__setattr__(self, "layer", layer)  # frozen: set once, read every cycle
        object.__setattr__(self, "name", name)

    def hold(self, th: Thresholds) -> float:
        """Seconds the condition must hold before the finding fires."""
        return _seconds(self.hold_s, th)

    def window(self, th: Thresholds) -> float:
        """Seconds a windowed input keeps a burst after it ended: added to the hold."""
        return _seconds(self.window_s, th)

    def clear(self, th: Thresholds) -> float:
        """Seconds the condition must be gone before the finding clears."""
        return _seconds(self.clear_s, th)


def _seconds(value: str | float, th: Thresholds) -> float:
    return float(getattr(th, value)) if isinstance(value, str) else float(value)


@dataclass(frozen=True)
class Finding:
    """An active finding: a rule whose condition held for its hold time on a subject."""

    id: str
    layer: str
    rule: str
    severity: str
    subject: Subject
    subject_name: str  # "GPU 3", "vllm meta-llama/Llama-3.1-70B-Instruct"
    title: str
    detail: str
    advice: str
    evidence: tuple[Evidence, ...]
    active_since: float  # taken_at when it fired
    condition_since: float  # taken_at when its condition started to hold
    clearing: bool = False  # the condition went away; the finding waits out its clear time

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "id": self.id,
            "layer": self.layer,
            "rule": self.rule,
            "severity": self.severity,
            "gpu": self.subject.gpu,
            "target": self.subject.target,
            "subject": self.subject_name,
            "title": self.title,
            "detail": self.detail,
            "advice": self.advice,
            "evidence": [_evidence_json(e) for e in self.evidence],
            "active_since": self.active_since,
            "active_for_seconds": round(max(0.0, now - self.active_since), 3),
            "clearing": self.clearing,
        }


def _evidence_json(e: Evidence) -> dict[str, Any]:
    from exporter.diagnosis.fmt import value_text

    return {
        "name": e.name,
        "value": e.value,
        "unit": e.unit,
        "threshold": e.threshold,
        "text": value_text(e.value, e.unit),
    }


@dataclass(frozen=True)
class OomRisk:
    """The OOM-risk score of one GPU (and the engine on it), with its reasons."""

    gpu: str
    uuid: str
    target: str
    ratio: float
    reasons: tuple[str, ...] = ()
    time_to_full_seconds: float | None = None
    taken_at: float = 0.0  # the frame the score (and its reasons) comes from
    now_ratio: float | None = None  # this frame's own score, where `ratio` is smoothed

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "uuid": self.uuid,
            "target": self.target,
            "ratio": round(self.ratio, 4),
            "now_ratio": None if self.now_ratio is None else round(self.now_ratio, 4),
            "reasons": list(self.reasons),
            "time_to_full_seconds": self.time_to_full_seconds,
        }


@dataclass(frozen=True)
class Trend:
    name: str
    unit: Unit
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Card:
    """One GPU or one engine as the page shows it."""

    kind: Literal["gpu", "engine"]
    key: str  # GPU index or engine target
    title: str
    subtitle: str
    up: bool
    numbers: tuple[Evidence, ...] = ()
    trends: tuple[Trend, ...] = ()
    gpus: tuple[str, ...] = ()  # engine cards: the GPUs it runs on

    def to_json(self) -> dict[str, Any]:
        from exporter.diagnosis.fmt import value_text

        return {
            "kind": self.kind,
            "key": self.key,
            "title": self.title,
            "subtitle": self.subtitle,
            "up": self.up,
            "gpus": list(self.gpus),
            "numbers": [
                {"name": n.name, "value": n.value, "unit": n.unit, "text": value_text(n.value, n.unit)}
                for n in self.numbers
            ],
            "trends": [
                {"name": t.name, "unit": t.unit, "points": [[round(x, 3), y] for x, y in t.points]}
                for t in self.trends
            ],
        }


@dataclass(frozen=True)
class Diagnosis:
    """The diagnosis of one snapshot: the node reading the page, the JSON and the CLI use.

    It declares no metric fields: the exposition renders nothing for it.
    """

    taken_at: float
    findings: tuple[Finding, ...] = ()
    oom_risks: tuple[OomRisk, ...] = ()
    gpus: tuple[Card, ...] = ()
    engines: tuple[Card, ...] = ()
    rules: tuple[tuple[str, str, str], ...] = ()  # (id, severity, title) of every rule
    history_seconds: float = 0.0
    simulated: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        sev = {f.severity for f in self.findings}
        return next((s for s in SEVERITIES if s in sev), "ok")

    def to_json(self) -> dict[str, Any]:
        by_sev = {s: sum(1 for f in self.findings if f.severity == s) for s in SEVERITIES}
        worst = max(self.oom_risks, key=lambda r: r.ratio, default=None)
        return {
            "taken_at": self.taken_at,
            "simulated": self.simulated,
            "status": self.status,
            "history_seconds": self.history_seconds,
            "summary": {
                "gpus": len(self.gpus),
                "gpus_up": sum(1 for g in self.gpus if g.up),
                "engines": len(self.engines),
                "engines_up": sum(1 for e in self.engines if e.up),
                "active_findings": len(self.findings),
                "by_severity": by_sev,
                "max_oom_risk": worst.to_json() if worst else None,
            },
            "findings": [f.to_json(self.taken_at) for f in self.findings],
            "oom_risk": [r.to_json() for r in self.oom_risks],
            "gpus": [g.to_json() for g in self.gpus],
            "engines": [e.to_json() for e in self.engines],
            "rules": [{"id": i, "severity": s, "title": t} for i, s, t in self.rules],
            **dict(self.extra),
        }


# ---- exported readings ---------------------------------------------------------------


@dataclass(frozen=True)
class FindingState:
    layer: str = label()
    rule: str = label()
    severity: str = label()
    gpu: str = label()
    target: str = label()
    active: int | None = gauge(
        "llmgpu_diagnosis_finding",
        "1 while the diagnosis rule holds for the GPU or engine, 0 otherwise; every rule and "
        "subject is always present (see docs/diagnosis.md for the rules)",
    )


@dataclass(frozen=True)
class FindingStates:
    """Every rule x subject, 0 or 1: a node reading."""

    items: tuple[FindingState, ...] = nested(FindingState)


@dataclass(frozen=True)
class OomRiskRatio:
    gpu: str = label()
    uuid: str = label()
    target: str = label()
    ratio: float | None = gauge(
        "llmgpu_diagnosis_oom_risk_ratio",
        "Out-of-memory risk of the GPU and the engine on it, 0-1, from free-memory trend, "
        "engine budget, allocator fragmentation and GPU sharing (a full KV cache preempts, "
        "it is not a reason)",
    )


@dataclass(frozen=True)
class OomRiskRatios:
    items: tuple[OomRiskRatio, ...] = nested(OomRiskRatio)


@dataclass(frozen=True)
class EngineEfficiency:
    target: str = label()
    energy_per_token_joules: float | None = gauge(
        "llmgpu_engine_energy_per_token_joules",
        "Energy the engine's GPUs used per generated token over the last minute, where the GPUs "
        "are the engine's alone (llmgpu_gpu_energy_joules_total over "
        "llmgpu_engine_generation_tokens_total)",
    )
    cost_per_million_tokens: float | None = gauge(
        "llmgpu_engine_cost_per_million_tokens",
        "What a million generated tokens cost over the last minute at the configured price per "
        "GPU-hour, in its currency; absent without a price (gpu_hour_price x GPUs x hours over "
        "llmgpu_engine_generation_tokens_total)",
    )


@dataclass(frozen=True)
class EngineEfficiencies:
    """Energy and cost per token of every engine: a node reading the Diagnoser adds."""

    items: tuple[EngineEfficiency, ...] = nested(EngineEfficiency)


@dataclass(frozen=True)
class EngineRecovery:
    target: str = label()
    last_downtime_seconds: float | None = gauge(
        "llmgpu_engine_last_downtime_seconds",
        "How long the engine was down the last time it crashed or restarted, from its first "
        "failed scrape to its first good one after it; absent until it came back from one "
        "(llmgpu_engine_up history)",
    )


@dataclass(frozen=True)
class EngineRecoveries:
    """The last downtime of every engine that came back from one: a node reading."""

    items: tuple[EngineRecovery, ...] = nested(EngineRecovery)
