"""The `@rule` decorator that declares a rule, and the helpers rules of several layers share."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import fields

from exporter.diagnosis.fmt import value_text
from exporter.diagnosis.frame import EngineFrame, Frame, GpuFrame
from exporter.diagnosis.history import History
from exporter.diagnosis.model import LAYERS, Candidate, Check, Evidence, Rule, Scope, Subject
from exporter.diagnosis.thresholds import Thresholds

Th = Thresholds
_REGISTERED: list[Rule] = []
_THRESHOLDS = {f.name for f in fields(Thresholds)}


def rule(
    id: str,
    *,
    severity: str,
    scope: Scope,
    hold: str | float,
    title: str,
    condition: str,
    advice: str,
    clear: str | float = "clear_s",
    window: str | float = 0.0,
    gpus_without_engine: bool = False,
) -> Callable[[Check], Check]:
    """Declare a rule on its check function: `(frame, history, thresholds) -> candidates`.

    `hold`, `clear` and `window` are seconds, or the name of the `Thresholds` field that
    holds them. `window` is the longest window the check's rates or quantiles are taken
    over: they keep a burst for that long after it ended, so the finding holds for
    `hold + window` (docs/diagnosis.md, "How a finding comes about").
    The rule's layer (the part of `id` before the slash) must be the module it lives in.
    `gpus_without_engine` gives a GPU x engine rule a subject for GPUs no engine runs on.
    """

    def register(check: Check) -> Check:
        layer = id.split("/", 1)[0]
        module = check.__module__.rsplit(".", 1)[-1]
        if layer not in LAYERS or module != layer:
            raise ValueError(f"rule {id}: declared in {check.__module__}, expected rules/{layer}.py")
        for value in (hold, clear, window):
            if isinstance(value, str) and value not in _THRESHOLDS:
                raise ValueError(f"rule {id}: no threshold named {value!r}")
        if any(r.id == id for r in _REGISTERED):
            raise ValueError(f"rule {id} is declared twice")
        _REGISTERED.append(
            Rule(
                id, severity, scope, title, condition, advice, check, hold, clear, window, gpus_without_engine
            )
        )
        return check

    return register


def registered() -> tuple[Rule, ...]:
    """Every declared rule, in layer order, then in the order of its module."""
    return tuple(sorted(_REGISTERED, key=lambda r: LAYERS.index(r.layer)))


def gpu_subject(g: GpuFrame) -> Subject:
    return Subject(gpu=str(g.index))


def engine_subject(e: EngineFrame) -> Subject:
    return Subject(target=e.target)


def _pct(v: float) -> str:
    return value_text(v, "ratio")


def _live(frame: Frame) -> Iterator[GpuFrame]:
    return (g for g in frame.gpus if g.up)


def _engine_gpus(frame: Frame, e: EngineFrame) -> list[GpuFrame]:
    return [g for g in (frame.gpu(i) for i in e.gpus) if g is not None and g.up]


def xid_increase(history: History, index: int, xids: tuple[int, ...], since: float) -> dict[int, int]:
    """XID events per id that arrived after `since`.

    The exporter counts XIDs from zero at its start, so a GPU without a frame before
    `since` starts from zero. A lost GPU may show no counts any more: its last counts
    while it answered are the current ones.
    """
    latest = history.latest
    g = latest.gpu(index) if latest is not None else None
    if g is None or (g.up and not g.xid_counts):
        return {}  # no XID data for this GPU, or none seen
    now = history.last_gpu(index, lambda x: x.xid_counts or None)
    if not now or not any(now.get(x, 0) for x in xids):
        return {}
    start = history.last_gpu(index, lambda x: x.xid_counts or None, at=since) or {}
    return {x: now[x] - start.get(x, 0) for x in xids if now.get(x, 0) > start.get(x, 0)}


def _xid_candidates(
    frame: Frame, history: History, th: Th, xids: tuple[int, ...], what: str
) -> Iterator[Candidate]:
    since = frame.taken_at - th.xid_window_s
    for g in frame.gpus:  # lost GPUs too: their XID came just before
        seen = sorted(xid_increase(history, g.index, xids, since).items())
        if seen:
            yield Candidate(
                gpu_subject(g),
                (
                    *(Evidence(f"XID {xid} events", n, "count") for xid, n in seen),
                    Evidence("window", th.xid_window_s, "seconds"),
                ),
                f"GPU {g.index} reported XID {', '.join(str(x) for x, _ in seen)} ({what})",
            )
