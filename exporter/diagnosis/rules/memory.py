"""Memory: OOM risk, KV-cache saturation and leaks, memory faults, fragmentation, burst headroom."""

from __future__ import annotations

from collections.abc import Iterator

from exporter.diagnosis.fmt import value_text
from exporter.diagnosis.frame import Frame
from exporter.diagnosis.history import History
from exporter.diagnosis.model import Candidate, Evidence, Subject
from exporter.diagnosis.oom import engine_budget, engines_on, oom_risks
from exporter.diagnosis.rules.base import (
    Th,
    _live,
    _pct,
    _xid_candidates,
    engine_subject,
    gpu_subject,
    rule,
)


@rule(
    "memory/oom_risk",
    severity="critical",
    scope="gpu_engine",
    hold="oom_hold_s",
    clear="oom_clear_s",
    gpus_without_engine=True,
    title="Out-of-memory risk",
    condition="OOM-risk score >= oom_finding_ratio (see the score's reasons)",
    advice=(
        "Find the growing process (llmgpu_gpu_process_memory_used_bytes); lower "
        "gpu_memory_utilization or restart the leaking process before it crashes."
    ),
)
def oom_risk(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for risk in oom_risks(frame, history, th):
        if risk.ratio < th.oom_finding_ratio:
            continue
        ev = [Evidence("OOM risk (this sample)", risk.ratio, "ratio", f">= {_pct(th.oom_finding_ratio)}")]
        if risk.time_to_full_seconds is not None:
            ev.append(Evidence("time to full at the current trend", risk.time_to_full_seconds, "seconds"))
        ev.extend(Evidence("reason", r) for r in risk.reasons)
        who = f"GPU {risk.gpu}"
        yield Candidate(
            Subject(gpu=risk.gpu, target=risk.target), tuple(ev), f"{who} is heading for out-of-memory"
        )


@rule(
    "memory/kv_cache_saturated",
    severity="warning",
    scope="engine",
    hold="kv_hold_s",
    title="KV cache full, requests preempted",
    window="rate_window_s",
    condition=(
        "KV-cache usage >= kv_usage_min_ratio and preemptions >= kv_preemptions_min_per_second over "
        "rate_window_s"
    ),
    advice=(
        "Lower max_num_seqs or max_model_len, use an FP8 KV cache, raise gpu_memory_utilization, or "
        "add replicas."
    ),
)
def kv_cache_saturated(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        if not e.up or e.kv_usage_ratio is None or e.kv_usage_ratio < th.kv_usage_min_ratio:
            continue
        pre = history.engine_rate(e.target, lambda x: x.preemptions_total, th.rate_window_s)
        if pre is None or pre < th.kv_preemptions_min_per_second:
            continue
        ev = [
            Evidence("KV-cache usage", e.kv_usage_ratio, "ratio", f">= {_pct(th.kv_usage_min_ratio)}"),
            Evidence("preemptions", pre, "per_second", f">= {th.kv_preemptions_min_per_second:g}/s"),
        ]
        if e.waiting is not None:
            ev.append(Evidence("waiting requests", e.waiting, "count"))
        yield Candidate(
            engine_subject(e),
            tuple(ev),
            f"{e.name}: KV cache {_pct(e.kv_usage_ratio)} full, {pre:.1f} preemptions/s",
            SGLANG_KV_ADVICE if e.kind == "sglang" else "",
        )


# SGLang admits on an estimate of the tokens requests will still need and retracts decoding
# requests when they outgrow it; its knobs have other names than vLLM's.
SGLANG_KV_ADVICE = (
    "SGLang retracts decoding requests when the token pool runs out: raise --schedule-conservativeness "
    "(admit on a more pessimistic estimate), lower --max-running-requests, raise --mem-fraction-static, "
    "use an FP8 KV cache (--kv-cache-dtype fp8_e5m2), or add replicas."
)


@rule(
    "memory/kv_cache_leak",
    severity="warning",
    scope="engine",
    hold="kv_leak_hold_s",
    title="KV cache stays used while nothing runs",
    condition="no request running or waiting while KV-cache usage >= kv_leak_min_ratio",
    advice=(
        "Blocks are not returned when requests finish (aborted streams, a connector or LoRA bug): "
        "check the engine's logs and version, and restart it at a quiet moment."
    ),
)
def kv_cache_leak(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        if not e.up or e.kv_usage_ratio is None or e.running is None or e.waiting is None:
            continue
        if e.running > 0 or e.waiting > 0 or e.kv_usage_ratio < th.kv_leak_min_ratio:
            continue
        yield Candidate(
            engine_subject(e),
            (
                Evidence("KV-cache usage", e.kv_usage_ratio, "ratio", f">= {_pct(th.kv_leak_min_ratio)}"),
                Evidence("running requests", e.running, "count", "= 0"),
                Evidence("waiting requests", e.waiting, "count", "= 0"),
            ),
            f"{e.name}: KV cache {_pct(e.kv_usage_ratio)} used with no request running or waiting",
        )


@rule(
    "memory/xid_memory_fault",
    severity="critical",
    scope="gpu",
    hold=0.0,
    clear=0.0,
    title="Memory fault in an application (XID 31/43)",
    condition="an XID listed in xid_memory seen in the last xid_window_s",
    advice=(
        "Read the engine's log around the XID: an OOM or an illegal address killed the CUDA context; "
        "restart it."
    ),
)
def xid_memory_fault(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    return _xid_candidates(frame, history, th, th.xid_memory, "memory fault in an application")


@rule(
    "memory/allocator_fragmentation",
    severity="warning",
    scope="gpu",
    hold="oom_hold_s",
    title="Allocator memory fragmented",
    condition=(
        "largest free block < oom_typical_request_bytes <= free bytes inside reserved segments, with "
        "fragmentation >= oom_fragmentation_min_ratio (allocator probe)"
    ),
    advice="Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; avoid varying large allocations.",
)
def allocator_fragmentation(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        for a in g.allocators:
            if a.largest_free_block_bytes is None or a.free_bytes is None:
                continue
            small = a.largest_free_block_bytes < th.oom_typical_request_bytes <= a.free_bytes
            frag = (a.fragmentation_ratio or 0.0) >= th.oom_fragmentation_min_ratio
            if not (small and frag):
                continue
            yield Candidate(
                gpu_subject(g),
                (
                    Evidence("process (pid)", a.pid, "id"),
                    Evidence("free inside reserved segments", a.free_bytes, "bytes"),
                    Evidence(
                        "largest free block",
                        a.largest_free_block_bytes,
                        "bytes",
                        f"< {value_text(th.oom_typical_request_bytes, 'bytes')}",
                    ),
                    Evidence(
                        "fragmentation",
                        a.fragmentation_ratio,
                        "ratio",
                        f">= {_pct(th.oom_fragmentation_min_ratio)}",
                    ),
                ),
                f"GPU {g.index}: pid {a.pid} has {value_text(a.free_bytes, 'bytes')} free but no block over "
                f"{value_text(a.largest_free_block_bytes, 'bytes')}",
            )
            break


@rule(
    "memory/burst_headroom",
    severity="warning",
    scope="gpu",
    hold="headroom_hold_s",
    title="The headroom the memory budget leaves is used up",
    condition=(
        "the engines' budgets leave 1 - gpu_memory_utilization >= headroom_planned_min_ratio of the GPU "
        "free, and less than headroom_kept_min_share of that is free (1 - used / total)"
    ),
    advice=(
        "Find what took the room (llmgpu_gpu_process_memory_used_bytes: a second process, or the "
        "engine beyond its budget with CUDA graphs or large sampler buffers); move it, or lower "
        "the engine's gpu_memory_utilization so the planned room is free again."
    ),
)
def burst_headroom(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        total, used = g.memory_total_bytes, g.memory_used_bytes
        engines = engines_on(frame, g)
        if g.mig_enabled or not engines or not total or used is None:
            continue  # MIG instances have budgets of their own; no engine, no budget
        budgets = [engine_budget(history, e) for e in engines]
        if any(b is None for b in budgets):
            continue  # an engine that does not say its budget: no planned room to hold it to
        budget = sum(b for b in budgets if b is not None)
        planned = round(1.0 - budget, 6)
        if planned < th.headroom_planned_min_ratio:
            continue
        free = 1.0 - used / total
        if free >= th.headroom_kept_min_share * planned:
            continue
        yield Candidate(
            gpu_subject(g),
            (
                Evidence("free memory", free, "ratio", f"< {_pct(th.headroom_kept_min_share * planned)}"),
                Evidence("room the budget leaves (1 - gpu_memory_utilization)", planned, "ratio"),
                Evidence("memory used", used, "bytes"),
                Evidence("engines' budget", budget * total, "bytes"),
            ),
            f"GPU {g.index} keeps {_pct(free)} free of the {_pct(planned)} its engines' budget leaves",
        )
