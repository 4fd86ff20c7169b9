"""The Diagnoser: history, hold and clear times, and the readings it adds to each snapshot.

It is an enricher: `Diagnoser()(snapshot)` returns the finding states (every rule x
subject, 0 or 1), the OOM-risk ratios, the rules blind for want of a signal
(diagnosis/coverage.py), and a `Diagnosis` for the page, the JSON API and the CLI.
Hold and clear are judged over windows (`step_state`): a finding fires when its
condition recurred through the rule's hold time and holds now, and clears when it was
nearly absent for its clear time; both are measured on `Snapshot.taken_at`, so a
simulation played fast behaves as it would in real time.
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from exporter.diagnosis import coverage
from exporter.diagnosis.efficiency import Efficiency, efficiencies, reading
from exporter.diagnosis.fmt import duration
from exporter.diagnosis.frame import EngineFrame, Frame, GpuFrame, frame_of
from exporter.diagnosis.history import History
from exporter.diagnosis.model import (
    Candidate,
    Card,
    Diagnosis,
    EngineEfficiencies,
    EngineRecoveries,
    EngineRecovery,
    Evidence,
    Finding,
    FindingState,
    FindingStates,
    OomRisk,
    OomRiskRatio,
    OomRiskRatios,
    Rule,
    Subject,
    Trend,
    Unit,
)
from exporter.diagnosis.oom import oom_risks
from exporter.diagnosis.recovery import Uptime, annotate
from exporter.diagnosis.rules import RULES
from exporter.diagnosis.thresholds import DEFAULT, Thresholds
from exporter.snapshot import Snapshot


@dataclass
class _State:
    """Hold/clear bookkeeping of one rule on one subject.

    `changes` keeps the times the condition flipped (a sample's value holds until the
    next sample), trimmed to the longer of the hold and clear windows: enough to say
    which share of either window the condition held.
    """

    changes: deque[tuple[float, bool]] = field(default_factory=deque)
    episode_since: float | None = None  # first true sample of the current episode
    on: bool = False  # the condition at the latest sample
    active: bool = False
    active_since: float = 0.0
    candidate: Candidate | None = None  # the last time the condition held
    exported: FindingState | None = None  # the reading last exported, reused while unchanged


def true_share(changes: deque[tuple[float, bool]], now: float, window: float) -> float:
    """Share of the last `window` seconds the condition held (sample and hold)."""
    if window <= 0:
        return 1.0 if changes and changes[-1][1] else 0.0
    start, held = now - window, 0.0
    points = list(changes)
    for i, (t, on) in enumerate(points):
        if not on:
            continue
        end = points[i + 1][0] if i + 1 < len(points) else now
        held += max(0.0, min(end, now) - max(t, start))
    return held / window


def step_state(
    state: _State,
    now: float,
    candidate: Candidate | None,
    hold_s: float,
    clear_s: float,
    th: Thresholds = DEFAULT,
) -> None:
    """Advance one rule x subject by one sample taken at `now`.

    An episode starts at the first sample the condition holds and lasts while it recurs:
    only `recur_s` without it ends the episode. A finding fires once its episode is
    `hold_s` old, the condition holds now, and it held for at least `hold_min_share` of
    the last `hold_s`. It clears once the condition does not hold now and held for at
    most `clear_max_share` of the last `clear_s` (at least `recur_s`, so that what
    counted as one episode does not clear between its waves). A storm that recurs every
    minute thus fires once and stays; one burst shorter than the hold time never fires
    (it would have to hold now, a hold time after it began). Event rules (hold 0,
    clear 0) fire on one sample and clear on the first sample without it.
    """
    on = candidate is not None
    state.on = on
    if on:
        state.candidate = candidate
    if not state.changes or state.changes[-1][1] != on:
        state.changes.append((now, on))
    clear_window = max(clear_s, th.recur_s) if clear_s > 0 else 0.0
    window = max(hold_s, clear_window, th.recur_s)
    while len(state.changes) >= 2 and state.changes[1][0] <= now - window:
        state.changes.popleft()  # the value at the window's start is the one kept
    if state.active:
        if not on and (
            clear_window <= 0 or true_share(state.changes, now, clear_window) <= th.clear_max_share
        ):
            state.active = False
            state.episode_since = None
        return
    if on and state.episode_since is None:
        state.episode_since = now
    elif not on and state.episode_since is not None and true_share(state.changes, now, th.recur_s) <= 0:
        state.episode_since = None  # a whole recurrence window without it: the episode is over
    if (
        on
        and state.episode_since is not None
        and now - state.episode_since >= hold_s
        and (hold_s <= 0 or true_share(state.changes, now, hold_s) >= th.hold_min_share)
    ):
        state.active = True
        state.active_since = now


# Per-GPU and per-engine trend charts: (title, unit, getter).
GPU_TRENDS: tuple[tuple[str, Unit, Callable[[GpuFrame], float | None]], ...] = (
    ("SM active", "ratio", lambda g: g.sm_active_ratio if g.sm_active_ratio is not None else g.util_ratio),
    ("memory used", "ratio", lambda g: g.memory_used_ratio),
    ("temperature", "celsius", lambda g: g.temperature_celsius),
    ("power", "watts", lambda g: g.power_watts),
)
ENGINE_TRENDS: tuple[tuple[str, Unit, Callable[[EngineFrame], float | None]], ...] = (
    ("KV-cache usage", "ratio", lambda e: e.kv_usage_ratio),
    ("waiting requests", "count", lambda e: e.waiting),
    ("generated tokens/s", "per_second", lambda e: e.generation_tokens_per_second),
    ("p99 time to first token", "seconds", lambda e: e.ttft_p99_seconds),
)


@dataclass
class _Bucketed:
    """A trend kept at a fixed resolution: the mean of each `width_s` bucket."""

    width_s: float
    points: deque[tuple[float, float]]
    bucket: int | None = None
    total: float = 0.0
    count: int = 0
    # the closed buckets as a tuple, made once per bucket rather than once per cycle
    _closed: tuple[tuple[float, float], ...] | None = None

    def add(self, t: float, v: float | None) -> None:
        b = int(t // self.width_s)
        if self.bucket is not None and b != self.bucket and self.count:
            self.points.append((self.bucket * self.width_s + self.width_s, self.total / self.count))
            self.total, self.count = 0.0, 0
            self._closed = None
        self.bucket = b
        if v is not None:
            self.total += v
            self.count += 1

    def view(self, now: float, horizon_s: float) -> tuple[tuple[float, float], ...]:
        if self._closed is None:
            self._closed = tuple(self.points)  # bounded by maxlen: the history span at this resolution
        pts = self._closed
        if pts and pts[0][0] < now - horizon_s:
            pts = pts[bisect.bisect_left(pts, (now - horizon_s,)) :]
        if self.count:
            pts = (*pts, (now, self.total / self.count))
        return pts


@dataclass
class _Trends:
    width_s: float
    points: int
    series: dict[tuple[str, str, str], _Bucketed] = field(default_factory=dict)

    def add(self, key: tuple[str, str, str], t: float, v: float | None) -> None:
        b = self.series.get(key)
        if b is None:
            b = self.series[key] = _Bucketed(self.width_s, deque(maxlen=self.points))
        b.add(t, v)

    def view(
        self, key: tuple[str, str, str], now: float, horizon_s: float
    ) -> tuple[tuple[float, float], ...]:
        b = self.series.get(key)
        return b.view(now, horizon_s) if b is not None else ()


class Diagnoser:
    """Holds the history and the hold/clear state; call it with each new snapshot."""

    __name__ = "diagnosis"  # the runner logs enrichers by name

    def __init__(
        self,
        history_seconds: float = 900.0,
        thresholds: Thresholds = DEFAULT,
        rules: Iterable[Rule] = RULES,
        gpu_hour_price: float | None = None,
    ) -> None:
        self.thresholds = thresholds
        self.gpu_hour_price = gpu_hour_price  # currency-free; None: no cost figures
        self.rules = tuple(rules)
        self.history = History(history_seconds)
        self._states: dict[tuple[str, str, str], _State] = {}
        self._lock = threading.Lock()
        self._risks: dict[tuple[str, str], deque[OomRisk]] = {}
        self._uptimes: dict[str, Uptime] = {}
        self._trends = _Trends(max(1.0, history_seconds / thresholds.trend_points), thresholds.trend_points)
        self.latest: Diagnosis | None = None

    def __call__(self, snapshot: Snapshot) -> tuple[object, ...]:
        frame = frame_of(snapshot)
        states, ratios, diagnosis, *rest = self.readings(frame)
        assert isinstance(diagnosis, Diagnosis)
        spots, blind = coverage.report(frame, snapshot)  # rules that cannot run, and why
        diagnosis = replace(diagnosis, extra={**diagnosis.extra, "blind_spots": [b.to_json() for b in spots]})
        self.latest = diagnosis
        return (states, ratios, diagnosis, *rest, blind)

    def step(self, frame: Frame) -> tuple[FindingStates, OomRiskRatios, Diagnosis]:
        states, ratios, diagnosis, *_ = self.readings(frame)
        assert isinstance(states, FindingStates) and isinstance(ratios, OomRiskRatios)
        assert isinstance(diagnosis, Diagnosis)
        return states, ratios, diagnosis

    def readings(self, frame: Frame) -> tuple[object, ...]:
        """Everything the diagnosis adds to a snapshot: finding states, OOM-risk ratios, the
        Diagnosis, and the engines' energy and cost per token."""
        with self._lock:
            return self._step(frame)

    def _step(self, frame: Frame) -> tuple[object, ...]:
        th = self.thresholds
        latest = self.history.latest
        if latest is not None and frame.taken_at < latest.taken_at:
            self.reset()
        frame = annotate(frame, self._uptimes)
        self.history.add(frame)
        now = frame.taken_at
        names = _subject_names(frame)
        states: list[FindingState] = []
        findings: list[Finding] = []
        seen: set[tuple[str, str, str]] = set()
        by_scope: dict[tuple[str, bool], list[Subject]] = {}
        for rule in self.rules:
            candidates = {c.subject.key: c for c in rule.check(frame, self.history, th)}
            hold, clear = rule.hold(th) + rule.window(th), rule.clear(th)
            scope = (rule.scope, rule.gpus_without_engine)
            if scope not in by_scope:
                by_scope[scope] = subjects(frame, rule)
            for subject in by_scope[scope]:
                key = (rule.id, *subject.key)
                seen.add(key)
                state = self._states.get(key)
                if state is None:
                    state = self._states[key] = _State()
                candidate = candidates.get(subject.key)
                step_state(state, now, candidate, hold, clear, th)
                active = int(state.active)
                if state.exported is None or state.exported.active != active:  # else the same reading
                    state.exported = FindingState(
                        rule.layer, rule.name, rule.severity, subject.gpu, subject.target, active
                    )
                states.append(state.exported)
                if state.active and state.candidate is not None:
                    findings.append(_finding(rule, subject, state, names))
        for key in [k for k in self._states if k not in seen]:
            del self._states[key]

        risks = self._smoothed(oom_risks(frame, self.history, th), now)
        worst: dict[str, float] = {}
        for r in risks:
            worst[r.gpu] = max(r.ratio, worst.get(r.gpu, 0.0))
        ratios = OomRiskRatios(tuple(OomRiskRatio(r.gpu, r.uuid, r.target, r.ratio) for r in risks))
        self._add_trends(frame)
        effs = efficiencies(frame, self.history, th.rate_window_s, self.gpu_hour_price)
        order = {s: i for i, s in enumerate(("critical", "warning", "info"))}
        findings.sort(
            key=lambda f: (order.get(f.severity, 9), f.id, f.subject.gpu.zfill(4), f.subject.target)
        )
        diagnosis = Diagnosis(
            taken_at=now,
            findings=tuple(findings),
            oom_risks=tuple(risks),
            gpus=tuple(self._gpu_card(g, worst.get(str(g.index))) for g in frame.gpus),
            engines=tuple(self._engine_card(e, frame, effs.get(e.target)) for e in frame.engines),
            rules=tuple((r.id, r.severity, r.title) for r in self.rules),
            history_seconds=self.history.span_s,
            simulated=frame.simulated,
        )
        self.latest = diagnosis
        costs = EngineEfficiencies(tuple(reading(t, x) for t, x in effs.items()))
        downtimes = EngineRecoveries(
            tuple(
                EngineRecovery(e.target, e.last_downtime_seconds)
                for e in frame.engines
                if e.last_downtime_seconds is not None
            )
        )
        return FindingStates(tuple(states)), ratios, diagnosis, costs, downtimes

    def reset(self) -> None:
        self.history.clear()
        self._states.clear()
        self._risks.clear()
        self._uptimes.clear()
        self._trends.series.clear()

    def _smoothed(self, risks: list[OomRisk], now: float) -> list[OomRisk]:
        """Each score as the highest of the last `oom_smooth_s`, with that moment's reasons.

        A windowed maximum rises with the first bad frame (an imminent OOM is not delayed
        the way a moving average would delay it) and falls only after a whole window
        without it, so a storm in waves reads as one steady score instead of 0-0.4-0.
        """
        window = self.thresholds.oom_smooth_s
        out, seen = [], set()
        for r in risks:
            key = (r.gpu, r.target)
            seen.add(key)
            # the window's candidates for its maximum, highest first: a score is dropped
            # once a later one is at least as high, so the front is the maximum
            past = self._risks.setdefault(key, deque())
            while past and past[-1].ratio <= r.ratio:
                past.pop()
            past.append(replace(r, taken_at=now))
            while past[0].taken_at < now - window:
                past.popleft()
            top = past[0]
            if top.taken_at < now and top.ratio > r.ratio:
                ago = duration(now - top.taken_at)
                top = replace(top, reasons=tuple(f"{ago} ago: {x}" for x in top.reasons))
            out.append(replace(top, taken_at=now, now_ratio=r.ratio))
        for key in [k for k in self._risks if k not in seen]:
            del self._risks[key]
        return out

    # ---- page material -------------------------------------------------------------

    def _add_trends(self, frame: Frame) -> None:
        t = frame.taken_at
        for g in frame.gpus:
            for title, _, get_g in GPU_TRENDS:
                self._trends.add(("gpu", str(g.index), title), t, get_g(g) if g.up else None)
        for e in frame.engines:
            for title, _, get_e in ENGINE_TRENDS:
                self._trends.add(("engine", e.target, title), t, get_e(e))

    def _gpu_card(self, g: GpuFrame, risk: float | None) -> Card:
        now, span = self.history.latest.taken_at if self.history.latest else 0.0, self.history.span_s
        numbers = [
            Evidence("utilization", g.util_ratio, "ratio"),
            Evidence("SM active", g.sm_active_ratio, "ratio"),
            Evidence("tensor active", g.tensor_active_ratio, "ratio"),
            Evidence("DRAM bandwidth", g.dram_active_ratio, "ratio"),
            Evidence("memory used", g.memory_used_bytes, "bytes"),
            Evidence("memory total", g.memory_total_bytes, "bytes"),
            Evidence("temperature", g.temperature_celsius, "celsius"),
            Evidence("power", g.power_watts, "watts"),
            Evidence("OOM risk", risk, "ratio"),
        ]
        if g.throttle_reasons:
            numbers.append(Evidence("clock events", ", ".join(g.throttle_reasons)))
        if g.mig_enabled:
            numbers.append(Evidence("MIG instances", len(g.mig), "count"))
        return Card(
            kind="gpu",
            key=str(g.index),
            title=f"GPU {g.index}",
            subtitle=g.name or g.uuid,
            up=g.up,
            numbers=tuple(n for n in numbers if n.value is not None),
            trends=tuple(
                Trend(title, unit, self._trends.view(("gpu", str(g.index), title), now, span))
                for title, unit, _ in GPU_TRENDS
            ),
        )

    def _engine_card(self, e: EngineFrame, frame: Frame, eff: Efficiency | None) -> Card:
        now, span = frame.taken_at, self.history.span_s
        eff = eff or Efficiency()
        numbers = [
            Evidence("running", e.running, "count"),
            Evidence("waiting", e.waiting, "count"),
            Evidence("KV-cache usage", e.kv_usage_ratio, "ratio"),
            Evidence("preemptions", e.preemptions_per_second, "per_second"),
            Evidence("requests", e.request_rate_per_second, "per_second"),
            Evidence("generated tokens", e.generation_tokens_per_second, "per_second"),
            Evidence("TTFT p99", e.ttft_p99_seconds, "seconds"),
            Evidence("ITL p50", e.itl_p50_seconds, "seconds"),
            Evidence("ITL p99", e.itl_p99_seconds, "seconds"),
            Evidence("spec-decode acceptance", e.spec_acceptance_ratio, "ratio"),
            Evidence("API-server CPU", e.api_server_cpu_ratio, "ratio"),
            Evidence("gpu_memory_utilization", e.gpu_memory_utilization, ""),
            Evidence("energy per generated token", eff.energy_per_token_joules, "joules"),
            Evidence("cost per million tokens", eff.cost_per_million_tokens, ""),
            Evidence("last downtime", e.last_downtime_seconds, "seconds"),
        ]
        return Card(
            kind="engine",
            key=e.target,
            title=e.name or e.target,
            subtitle=f"{e.kind or 'engine'} · {e.model or 'model unknown'} · {e.target}",
            up=e.up,
            numbers=tuple(n for n in numbers if n.value is not None),
            trends=tuple(
                Trend(title, unit, self._trends.view(("engine", e.target, title), now, span))
                for title, unit, _ in ENGINE_TRENDS
            ),
            gpus=tuple(str(i) for i in e.gpus),
        )


def subjects(frame: Frame, rule: Rule) -> list[Subject]:
    """Every subject a rule speaks about, whether its condition holds or not."""
    if rule.scope == "gpu":
        return [Subject(gpu=str(g.index)) for g in frame.gpus]
    if rule.scope == "engine":
        return [Subject(target=e.target) for e in frame.engines]
    out = []
    for g in frame.gpus:
        on = [e for e in frame.engines if g.index in e.gpus]
        if rule.gpus_without_engine and not on:
            out.append(Subject(gpu=str(g.index)))
        out.extend(Subject(gpu=str(g.index), target=e.target) for e in on)
    return out


def _subject_names(frame: Frame) -> dict[tuple[str, str], str]:
    names: dict[tuple[str, str], str] = {}
    for g in frame.gpus:
        names[(str(g.index), "")] = f"GPU {g.index}"
    for e in frame.engines:
        label = e.name or e.target
        names[("", e.target)] = label
        for i in e.gpus:
            names[(str(i), e.target)] = f"GPU {i} / {label}"
    return names


def _finding(rule: Rule, subject: Subject, state: _State, names: dict[tuple[str, str], str]) -> Finding:
    c = state.candidate
    assert c is not None
    return Finding(
        id=rule.id,
        layer=rule.layer,
        rule=rule.name,
        severity=rule.severity,
        subject=subject,
        subject_name=names.get(subject.key, subject.gpu or subject.target),
        title=rule.title,
        detail=c.detail,
        advice=c.advice or rule.advice,
        evidence=c.evidence,
        active_since=state.active_since,
        condition_since=state.episode_since if state.episode_since is not None else state.active_since,
        clearing=not state.on,
    )
