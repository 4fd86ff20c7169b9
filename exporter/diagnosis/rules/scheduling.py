"""Scheduling: queues that grow while GPUs have room, the API server, admission, the balance
of prefill and decode."""

from __future__ import annotations

from collections.abc import Iterator
from statistics import mean

from exporter.diagnosis.frame import EngineFrame, Frame, GpuFrame
from exporter.diagnosis.history import History
from exporter.diagnosis.model import Candidate, Evidence, Unit
from exporter.diagnosis.rules.base import (
    Th,
    _engine_gpus,
    _pct,
    engine_subject,
    rule,
)


def _sm_or_util(g: GpuFrame) -> float | None:
    return g.sm_active_ratio if g.sm_active_ratio is not None else g.util_ratio


@rule(
    "scheduling/queue_with_idle_gpu",
    severity="warning",
    scope="engine",
    hold="queue_hold_s",
    title="Requests queue while GPUs have room",
    condition=(
        "waiting >= queue_waiting_min and not falling over a minute, SM active < "
        "queue_sm_active_max_ratio, KV usage < queue_kv_usage_max_ratio"
    ),
    advice=(
        "Follow the limit the finding names (running vs max_num_seqs, KV concurrency, the API "
        "server's core, deferred requests); where none binds, look at the scheduler and the client."
    ),
)
def queue_with_idle_gpu(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        if not e.up or e.waiting is None or e.waiting < th.queue_waiting_min:
            continue
        gpus = _engine_gpus(frame, e)
        act = [v for v in (_sm_or_util(g) for g in gpus) if v is not None]
        if not act or mean(act) >= th.queue_sm_active_max_ratio:
            continue
        if e.kv_usage_ratio is not None and e.kv_usage_ratio >= th.queue_kv_usage_max_ratio:
            continue
        past = history.engine_series(e.target, lambda x: x.waiting, th.rate_window_s)
        if past and e.waiting < past[0][1]:
            continue  # the queue drains
        limits, advice = _binding_limit(e, th)
        yield Candidate(
            engine_subject(e),
            (
                Evidence("waiting requests", e.waiting, "count", f">= {th.queue_waiting_min:g}"),
                Evidence("waiting a minute ago", past[0][1] if past else None, "count"),
                Evidence(
                    "SM active (mean of its GPUs)",
                    mean(act),
                    "ratio",
                    f"< {_pct(th.queue_sm_active_max_ratio)}",
                ),
                Evidence(
                    "KV-cache usage", e.kv_usage_ratio, "ratio", f"< {_pct(th.queue_kv_usage_max_ratio)}"
                ),
                *limits,
            ),
            f"{e.name}: {e.waiting:.0f} requests wait while its GPUs are {_pct(mean(act))} active",
            advice,
        )


def _binding_limit(e: EngineFrame, th: Th) -> tuple[list[Evidence], str]:
    """The evidence on each limit a queue can hit, and advice for the one that binds."""
    running = e.running or 0.0
    near = th.queue_limit_near_ratio
    seqs = e.max_num_seqs
    ev = [
        Evidence("running", running, "count"),
        Evidence(
            "max_num_seqs", seqs if seqs is not None else "unknown (the engine does not report it)", "count"
        ),
    ]
    if e.kv_cache_max_concurrency is not None:
        ev.append(Evidence("KV cache holds (full-length requests)", e.kv_cache_max_concurrency, "count"))
    ev.append(
        Evidence(
            "max_num_batched_tokens",
            e.max_num_batched_tokens if e.max_num_batched_tokens is not None else "unknown",
            "count",
        )
    )
    if e.api_server_cpu_ratio is not None:
        ev.append(Evidence("API-server CPU (one core = 100 %)", e.api_server_cpu_ratio, "ratio"))
    if e.waiting_deferred is not None:
        ev.append(Evidence("waiting, deferred (LoRA, KV transfer)", e.waiting_deferred, "count"))
    if e.waiting and e.waiting_deferred is not None and e.waiting_deferred >= 0.5 * e.waiting:
        return ev, (
            f"{e.waiting_deferred:.0f} of {e.waiting:.0f} waiting requests are deferred, not short of "
            "capacity: check the LoRA adapter budget (max_loras) and KV transfers."
        )
    if e.api_server_cpu_ratio is not None and e.api_server_cpu_ratio >= th.api_cpu_min_ratio:
        return ev, (
            f"The API server uses {_pct(e.api_server_cpu_ratio)} of its one core: it cannot hand requests "
            "over faster; run more API-server processes (--api-server-count)."
        )
    if seqs is not None and running >= near * seqs:
        return ev, f"{running:.0f} of max_num_seqs {seqs} run: raise max_num_seqs (the KV cache has room)."
    if e.kv_cache_max_concurrency is not None and running >= near * e.kv_cache_max_concurrency:
        return ev, (
            f"{running:.0f} running fill the KV cache's {e.kv_cache_max_concurrency:.0f} full-length "
            "requests: lower max_model_len or use an FP8 KV cache."
        )
    known = (
        f"{running:.0f} of max_num_seqs {seqs} run"
        if seqs is not None
        else (f"{running:.0f} run, max_num_seqs unknown (declare it with the target: #max_num_seqs=N)")
    )
    return ev, (
        f"No reported limit binds: {known}, KV cache and API server have room. Check the token "
        "budget (max_num_batched_tokens"
        + (f" {e.max_num_batched_tokens}" if e.max_num_batched_tokens is not None else ", not reported")
        + "), long prefills that hold the scheduler, and the scheduler's step time."
    )


@rule(
    "scheduling/api_server_cpu_bound",
    severity="warning",
    scope="engine",
    hold="api_cpu_hold_s",
    title="API server at one full core",
    condition="API-server process CPU >= api_cpu_min_ratio of one core",
    advice="Run more API-server processes (vLLM --api-server-count), move tokenization off the hot path.",
)
def api_server_cpu_bound(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        if e.api_server_cpu_ratio is None or e.api_server_cpu_ratio < th.api_cpu_min_ratio:
            continue
        yield Candidate(
            engine_subject(e),
            (
                Evidence(
                    "API-server CPU (one core = 100 %)",
                    e.api_server_cpu_ratio,
                    "ratio",
                    f">= {_pct(th.api_cpu_min_ratio)}",
                ),
            ),
            f"{e.name}: the API-server process uses {_pct(e.api_server_cpu_ratio)} of one core",
        )


@rule(
    "scheduling/admission_rejections",
    severity="warning",
    scope="engine",
    hold="rejections_hold_s",
    window="rate_window_s",
    title="Requests refused at admission",
    condition="rejected requests >= rejections_min_per_second over rate_window_s",
    advice="Add capacity or raise the admission limit; make clients back off and retry.",
)
def admission_rejections(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        r = history.engine_rate(e.target, lambda x: x.rejected_total, th.rate_window_s)
        if r is None or r < th.rejections_min_per_second:
            continue
        yield Candidate(
            engine_subject(e),
            (Evidence("rejected requests", r, "per_second", f">= {th.rejections_min_per_second:g}/s"),),
            f"{e.name} refuses {r:.1f} requests/s at admission",
            TGI_REJECTION_ADVICE if e.kind == "tgi" else "",
        )


# TGI's router answers "overloaded" past its concurrency limit, before any queue or batch.
TGI_REJECTION_ADVICE = (
    "TGI's router refuses requests past --max-concurrent-requests (128 by default): add replicas "
    "behind the load balancer, or raise the limit where the GPUs have room (they queue instead); "
    "make clients back off and retry."
)


def _activity(frame: Frame, e: EngineFrame) -> float | None:
    """Mean SM activity (NVML utilization where there is none) of the engine's GPUs."""
    act = [v for v in (_sm_or_util(g) for g in _engine_gpus(frame, e)) if v is not None]
    return mean(act) if act else None


@rule(
    "scheduling/prefill_starves_decode",
    severity="warning",
    scope="engine",
    hold="pd_hold_s",
    title="Prefill saturated while decode starves",
    condition=(
        "a prefill engine with waiting >= pd_prefill_waiting_min and SM active >= "
        "pd_prefill_busy_min_ratio; every decode engine of its model with SM active < "
        "pd_decode_idle_max_ratio and empty prealloc and transfer queues"
    ),
    advice=(
        "Move capacity from decode to prefill: more prefill instances or GPUs per prefill instance "
        "(a higher prefill:decode ratio), a larger chunked-prefill budget, prefix caching on the prefill "
        "side; fewer decode instances."
    ),
)
def prefill_starves_decode(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for p in frame.engines:
        if not p.up or p.disagg_role != "prefill" or (p.waiting or 0.0) < th.pd_prefill_waiting_min:
            continue
        busy = _activity(frame, p)
        if busy is None or busy < th.pd_prefill_busy_min_ratio:
            continue
        decode = [d for d in frame.engines if d.up and d.disagg_role == "decode" and d.model == p.model]
        idle = [_activity(frame, d) for d in decode]
        queued = sum(sum((d.disagg_queues or {}).values()) for d in decode)
        if not decode or any(a is None or a >= th.pd_decode_idle_max_ratio for a in idle) or queued >= 1:
            continue
        decode_act = mean(a for a in idle if a is not None)
        yield Candidate(
            engine_subject(p),
            (
                Evidence("prefill waiting requests", p.waiting, "count", f">= {th.pd_prefill_waiting_min:g}"),
                Evidence("prefill SM active", busy, "ratio", f">= {_pct(th.pd_prefill_busy_min_ratio)}"),
                Evidence("decode engines of the model", ", ".join(d.name for d in decode)),
                Evidence(
                    "decode SM active (mean)", decode_act, "ratio", f"< {_pct(th.pd_decode_idle_max_ratio)}"
                ),
                Evidence("decode running", sum(d.running or 0.0 for d in decode), "count"),
                Evidence("decode prealloc + transfer queues", queued, "count", "< 1"),
            ),
            f"{p.name}: prefill holds {p.waiting:.0f} waiting requests with its GPUs {_pct(busy)} active, "
            f"while its decode side idles at {_pct(decode_act)}",
        )


def _tenants(g: GpuFrame, ours: frozenset[int]) -> tuple[dict[str, float], dict[str, float], float, float]:
    """(SM share by other owner, memory by other owner, SM of all processes, the engine's SM)."""
    sm_of = g.process_sm or {}
    sm: dict[str, float] = {}
    held: dict[str, float] = {}
    own_sm = 0.0
    for pid in {*sm_of, *g.process_memory}:
        if pid in ours:
            own_sm += sm_of.get(pid, 0.0)
            continue
        owner = g.process_owner.get(pid, f"pid {pid}")
        sm[owner] = sm.get(owner, 0.0) + sm_of.get(pid, 0.0)
        held[owner] = held.get(owner, 0.0) + g.process_memory.get(pid, 0.0)
    return sm, held, sum(sm_of.values()), own_sm


def _slowdown(e: EngineFrame, history: History, th: Th) -> tuple[str, float, float] | None:
    """(what slowed, now, its best over the baseline window) where the engine is slower."""
    window = th.neighbour_baseline_s
    for name, now, get in (
        ("median inter-token latency", e.itl_p50_seconds, lambda x: x.itl_p50_seconds),
        ("median time to first token", e.ttft_p50_seconds, lambda x: x.ttft_p50_seconds),
    ):
        best = min((v for _, v in history.engine_series(e.target, get, window)), default=None)
        if now is not None and best and now >= th.neighbour_slowdown_factor * best:
            return name, now, best
    tps = e.generation_tokens_per_second
    series = history.engine_series(e.target, lambda x: x.generation_tokens_per_second, window)
    load = e.running if e.running is not None else 0.0
    if tps is not None and series:
        top_t, top = max(series, key=lambda p: p[1])
        then = history.engine_series(e.target, lambda x: x.running, window)
        at_top = next((v for t, v in then if t == top_t), None)
        if top and tps * th.neighbour_slowdown_factor <= top and at_top is not None and load >= at_top:
            return "generation throughput", tps, top
    return None


@rule(
    "scheduling/noisy_neighbour",
    severity="warning",
    scope="engine",
    hold="neighbour_hold_s",
    window="rate_window_s",  # latency medians and a throughput over the last minute
    title="Another tenant of the GPU slows the engine",
    condition=(
        "another owner's processes on the engine's GPU use >= neighbour_share_ratio of the SM time "
        "used there (or of the memory in use) while the engine's median ITL or TTFT is "
        ">= neighbour_slowdown_factor x its best over neighbour_baseline_s (or its throughput as "
        "much below its best, with no fewer requests running)"
    ),
    advice=(
        "Move the neighbour (or the engine) to a GPU of its own, or give the GPU's time to the "
        "engine: fewer time-slicing replicas, an MPS active-thread percentage for the neighbour, "
        "a MIG instance each; schedule the batch work outside the engine's busy hours."
    ),
)
def noisy_neighbour(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        if not e.up or not e.pids:
            continue  # its processes are needed to tell it from its neighbours
        slow = _slowdown(e, history, th)
        if slow is None:
            continue
        for g in _engine_gpus(frame, e):
            if g.mig_enabled:
                continue  # MIG instances have SMs and memory of their own
            sm, held, all_sm, own_sm = _tenants(g, e.pids)
            used = sum(g.process_memory.values())
            heavy = [
                o
                for o in sm
                if (all_sm and sm[o] >= th.neighbour_share_ratio * all_sm)
                or (used and held[o] >= th.neighbour_share_ratio * used)
            ]
            if not heavy:
                continue
            who = max(heavy, key=lambda o: (sm[o], held[o]))
            mine = {g.process_owner.get(p, "") for p in e.pids if p in g.process_owner} - {""}
            engine_owner = ", ".join(sorted(mine)) or e.name
            what, now, best = slow
            unit: Unit = "per_second" if what == "generation throughput" else "seconds"
            yield Candidate(
                engine_subject(e),
                (
                    Evidence("neighbour", who),
                    Evidence(
                        "neighbour's share of the SM time used",
                        sm[who] / all_sm if all_sm else None,
                        "ratio",
                        f">= {_pct(th.neighbour_share_ratio)}",
                    ),
                    Evidence("neighbour's memory", held[who], "bytes"),
                    Evidence("engine", engine_owner),
                    Evidence(
                        "engine's share of the SM time used", own_sm / all_sm if all_sm else None, "ratio"
                    ),
                    Evidence(what, now, unit),
                    Evidence(f"best {what} in {th.neighbour_baseline_s / 60:.0f} min", best, unit),
                ),
                f"{e.name} ({engine_owner}) slowed: {what} {now / best:.1f}x its best while {who} "
                f"takes {_pct(sm[who] / all_sm if all_sm else 0.0)} of GPU {g.index}'s SM time",
            )
            break
