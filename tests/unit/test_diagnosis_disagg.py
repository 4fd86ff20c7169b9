"""Prefill/decode disaggregation: the two rules at the edges of their thresholds."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from exporter.diagnosis.frame import EngineFrame, Frame
from exporter.diagnosis.rules import RULES_BY_ID
from exporter.diagnosis.thresholds import DEFAULT
from tests.support.diagnosis_builders import engine, frame, gpu, run_rule

TH = DEFAULT
EPS = 1e-3
MODEL = "meta-llama/Llama-3.1-70B-Instruct"
STARVES = "scheduling/prefill_starves_decode"
SLOW = "parallel/kv_transfer_slow"


def fires(rule_id: str, frames: list[Frame]) -> bool:
    return bool(run_rule(RULES_BY_ID[rule_id], frames))


def pd(
    prefill_sm: float = 0.92,
    decode_sm: float = 0.2,
    waiting: float = 30.0,
    decode_queues: dict[str, float] | None = None,
    decode_model: str = MODEL,
    **prefill: Any,
) -> Frame:
    """One node: a prefill engine on GPUs 0-1 and a decode engine on GPUs 2-3 (SGLang's queues)."""
    gpus = tuple(replace(gpu(i), sm_active_ratio=prefill_sm if i < 2 else decode_sm) for i in range(4))
    p = engine(
        "http://10.0.0.1:30000/metrics",
        gpus=(0, 1),
        kind="sglang",
        model=MODEL,
        waiting=waiting,
        disagg_queues={"prefill_bootstrap": 0.0, "prefill_inflight": 0.0},
        **prefill,
    )
    d = engine(
        "http://10.0.0.1:30001/metrics",
        gpus=(2, 3),
        kind="sglang",
        model=decode_model,
        running=12.0,
        disagg_queues=decode_queues or {"decode_prealloc": 0.0, "decode_transfer": 0.0},
    )
    return frame(0.0, gpus, (p, d))


def test_prefill_starves_decode_fires_at_its_edges() -> None:
    assert fires(STARVES, [pd(prefill_sm=TH.pd_prefill_busy_min_ratio)])
    assert fires(STARVES, [pd(waiting=TH.pd_prefill_waiting_min)])
    assert fires(STARVES, [pd(decode_sm=TH.pd_decode_idle_max_ratio - EPS)])
    (c,) = run_rule(RULES_BY_ID[STARVES], [pd()])
    assert c.subject.target == "http://10.0.0.1:30000/metrics", "the prefill side is the bottleneck"
    assert {e.name for e in c.evidence} >= {"prefill waiting requests", "decode SM active (mean)"}


def test_prefill_starves_decode_stays_quiet_when_the_split_is_not_the_cause() -> None:
    assert not fires(STARVES, [pd(prefill_sm=TH.pd_prefill_busy_min_ratio - EPS)])  # prefill has room
    assert not fires(STARVES, [pd(waiting=TH.pd_prefill_waiting_min - 1)])  # nothing waits
    assert not fires(STARVES, [pd(decode_sm=TH.pd_decode_idle_max_ratio)])  # decode is busy too
    # requests are on their way to decode: it is not starved, it waits for transfers
    assert not fires(STARVES, [pd(decode_queues={"decode_prealloc": 0.0, "decode_transfer": 3.0})])
    assert not fires(STARVES, [pd(decode_model="another/model")])  # not its decode side


def test_prefill_starves_decode_needs_disaggregated_engines() -> None:
    f = pd()
    unified = replace(f, engines=tuple(replace(e, disagg_queues=None) for e in f.engines))
    assert not fires(STARVES, [unified])
    down = replace(f, engines=(f.engines[0], replace(f.engines[1], up=False)))
    assert not fires(STARVES, [down])


def transfer(latency: float | None, ttft: float, peer_ttft: float | None = None, **kw: Any) -> Frame:
    """The engine that reports the transfer, and (optionally) another engine of the same model."""
    engines: list[EngineFrame] = [
        engine(model=MODEL, kv_transfer_latency_seconds=latency, ttft_p50_seconds=ttft, **kw)
    ]
    if peer_ttft is not None:
        engines.append(engine("http://10.0.0.1:8001/metrics", model=MODEL, ttft_p50_seconds=peer_ttft))
    return frame(0.0, (gpu(0),), tuple(engines))


def test_kv_transfer_slow_edges() -> None:
    share, low = TH.kv_transfer_ttft_share_min, TH.kv_transfer_ttft_min_s
    assert fires(SLOW, [transfer(share * 1.0, 1.0)])
    assert not fires(SLOW, [transfer(share * 1.0 - EPS, 1.0)])
    # a transfer that is most of a fast TTFT is no problem
    assert fires(SLOW, [transfer(low * share, low)])
    assert not fires(SLOW, [transfer(0.9 * (low - EPS), low - EPS)])
    assert not fires(SLOW, [transfer(None, 2.0)])  # no connector, no verdict
    assert not fires(SLOW, [transfer(1.0, 2.0, up=False)])


def test_kv_transfer_slow_reads_ttft_where_the_first_token_leaves() -> None:
    # SGLang reports the transfer on the prefill side; the first token leaves the decode side
    assert fires(SLOW, [transfer(0.6, 0.1, peer_ttft=1.0)])
    assert not fires(SLOW, [transfer(0.3, 0.1, peer_ttft=1.0)])
    (c,) = run_rule(RULES_BY_ID[SLOW], [transfer(0.6, 0.1, peer_ttft=1.0)])
    assert next(e.value for e in c.evidence if e.name == "time to first token p50") == 1.0


def test_kv_transfer_slow_shows_failed_transfers() -> None:
    frames = [
        replace(
            transfer(0.8, 1.0, kv_transfer_failures_total=0.5 * t), taken_at=transfer(0.8, 1.0).taken_at + t
        )
        for t in (0.0, 30.0, 60.0)
    ]
    (c,) = run_rule(RULES_BY_ID[SLOW], frames)
    assert next(e.value for e in c.evidence if e.name == "failed transfers") == 0.5
