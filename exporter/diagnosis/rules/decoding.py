"""Decoding: speculative-decoding acceptance, token-stream jitter."""

from __future__ import annotations

from collections.abc import Iterator

from exporter.diagnosis.frame import Frame
from exporter.diagnosis.history import History
from exporter.diagnosis.model import Candidate, Evidence
from exporter.diagnosis.rules.base import (
    Th,
    _pct,
    engine_subject,
    rule,
)


@rule(
    "decoding/low_spec_acceptance",
    severity="info",
    scope="engine",
    hold="spec_hold_s",
    window="rate_window_s",
    title="Speculative decoding rarely accepted",
    condition="accepted / proposed draft tokens < spec_accept_min_ratio with requests running",
    advice="Use a draft model closer to the target, fewer speculative tokens, or switch speculation off.",
)
def low_spec_acceptance(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        acc = e.spec_acceptance_ratio
        if acc is None or acc >= th.spec_accept_min_ratio or not e.running:
            continue
        yield Candidate(
            engine_subject(e),
            (Evidence("draft tokens accepted", acc, "ratio", f"< {_pct(th.spec_accept_min_ratio)}"),),
            f"{e.name} accepts only {_pct(acc)} of its speculative draft tokens",
        )


@rule(
    "decoding/itl_jitter",
    severity="warning",
    scope="engine",
    hold="itl_hold_s",
    window="rate_window_s",
    title="Token stream stutters",
    condition="inter-token latency p99 / p50 >= itl_jitter_factor with requests running",
    advice=(
        "Enable chunked prefill (smaller max_num_batched_tokens) and check for preemptions and host stalls."
    ),
)
def itl_jitter(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        p50, p99 = e.itl_p50_seconds, e.itl_p99_seconds
        if not p50 or p99 is None or not e.running:
            continue
        if p99 / p50 < th.itl_jitter_factor:
            continue
        yield Candidate(
            engine_subject(e),
            (
                Evidence("inter-token latency p99 / p50", p99 / p50, "", f">= {th.itl_jitter_factor:g}"),
                Evidence("p50", p50, "seconds"),
                Evidence("p99", p99, "seconds"),
            ),
            f"{e.name}: token stream stutters, p99 inter-token latency {p99 / p50:.1f}x the median",
        )
