"""The /metrics page of each engine kind, written from one instant of a simulated engine.

sim/engines.py integrates the scenario's quantities into counters and histograms; this
module names and labels them the way each engine does, so that the exporter's scraper
and normalizer read a simulated SGLang or TGI exactly as they read a real one:

- vLLM 0.32: `vllm:` names, labels `engine` and `model_name` (vllm/v1/metrics/loggers.py);
  a disaggregated engine adds the NIXL connector's transfer families
  (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py, NixlPromMetrics).
- SGLang 0.5: `sglang:` names (python/sglang/srt/metrics/collector.py). Scheduler
  families carry `model_name`, `engine_type` (unified, prefill, decode), `tp_rank`,
  `pp_rank`, `moe_ep_rank` and come from every tensor-parallel rank; tokenizer families
  carry `model_name` only. Every scheduler gauge is present in every mode, the
  disaggregation ones at 0 where the role has no such queue, as SGLang's log_stats sets them.
- TGI 3.x router: `tgi_` names as metrics-exporter-prometheus writes them (TYPE lines,
  counters without `_total`, no model label); duration histograms on the router's
  geometric buckets (0.0001 x 1.5^k), token-length histograms on 100 even buckets up to
  the context length (router/src/server.rs). TGI has no KV-usage, preemption or
  time-to-first-token family, so a TGI page has none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from exporter.sim.scenario import EngineSpec

# The context length the simulated engines are started with (scenarios cannot set it):
# vLLM's kv_cache_max_concurrency is the KV cache's tokens over it; TGI's token-length
# buckets reach it.
SIM_MAX_MODEL_LEN = 32768

Bounds = tuple[float, ...]
# vLLM 0.32's bucket bounds (vllm/v1/metrics/loggers.py), +Inf added by the writer.
VLLM_TTFT: Bounds = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
VLLM_TTFT += (20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL: Bounds = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
)
VLLM_ITL += (40.0, 80.0)
VLLM_REQUEST: Bounds = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
)
VLLM_REQUEST += (240.0, 480.0, 960.0, 1920.0, 7680.0)
NIXL_XFER = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))
# SGLang's defaults (TokenizerMetricsCollector, SchedulerMetricsCollector.queue_time).
SGLANG_TTFT: Bounds = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0)
SGLANG_TTFT += (200.0, 400.0)
SGLANG_ITL: Bounds = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06)
SGLANG_ITL += (0.08, 0.1)
SGLANG_ITL += (0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
SGLANG_E2E = (*SGLANG_TTFT, 600.0, 1200.0, 1800.0, 2400.0)
SGLANG_QUEUE: Bounds = (0.0, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
SGLANG_QUEUE += (70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0)
SGLANG_QUEUE += (1200.0, 1400.0, 1600.0, 1800.0, 2000.0, 2500.0, 3000.0)
TGI_DURATION = tuple(0.0001 * 1.5**k for k in range(1, 36))
TGI_TOKENS = tuple(SIM_MAX_MODEL_LEN / 100 * (x + 1) for x in range(100))

# Which histograms each kind's page carries: law key (sim/engines.py) -> (name, bounds).
HISTOGRAMS: Mapping[str, Mapping[str, tuple[str, Bounds]]] = {
    "vllm": {
        "ttft": ("time_to_first_token_seconds", VLLM_TTFT),
        "itl": ("inter_token_latency_seconds", VLLM_ITL),
        "e2e": ("e2e_request_latency_seconds", VLLM_REQUEST),
        "queue": ("request_queue_time_seconds", VLLM_REQUEST),
        "prefill": ("request_prefill_time_seconds", VLLM_REQUEST),
        "decode": ("request_decode_time_seconds", VLLM_REQUEST),
        "kv_transfer": ("nixl_xfer_time_seconds", NIXL_XFER),
        "kv_bytes": ("nixl_bytes_transferred", NIXL_BYTES),
    },
    "sglang": {
        "ttft": ("time_to_first_token_seconds", SGLANG_TTFT),
        "itl": ("inter_token_latency_seconds", SGLANG_ITL),
        "e2e": ("e2e_request_latency_seconds", SGLANG_E2E),
        "queue": ("queue_time_seconds", SGLANG_QUEUE),
    },
    "tgi": {
        "e2e": ("request_duration", TGI_DURATION),
        "queue": ("request_queue_duration", TGI_DURATION),
        "itl_mean": ("request_mean_time_per_token_duration", TGI_DURATION),
        "prompt_len": ("request_input_length", TGI_TOKENS),
        "gen_len": ("request_generated_tokens", TGI_TOKENS),
        # one family, by method: a prefill batch per request, a decode step per token of a sequence
        "batch_prefill": ("batch_inference_duration", TGI_DURATION),
        "batch_decode": ("batch_inference_duration", TGI_DURATION),
    },
}
NIXL_KEYS = frozenset({"kv_transfer", "kv_bytes"})  # only on a disaggregated vLLM


@dataclass(frozen=True)
class Instant:
    """One instant of a simulated engine: what its page is written from."""

    spec: EngineSpec
    value: Callable[[str], float]  # a scenario quantity now, never below 0
    acc: Mapping[str, float]  # counters: integrals since the engine's last restart
    hists: Mapping[str, Sequence[float]]  # law key -> (count, sum, *cumulative buckets)
    spec_decode: bool  # a phase sets speculative decoding
    estimates: bool  # a phase sets the FLOP / byte estimates


def histograms_of(spec: EngineSpec) -> Mapping[str, tuple[str, Bounds]]:
    """The histograms the page of this engine carries."""
    own = HISTOGRAMS[spec.kind]
    if spec.kind == "vllm" and spec.role == "unified":
        return {k: v for k, v in own.items() if k not in NIXL_KEYS}
    return own


def write(now: Instant) -> str:
    return {"vllm": _vllm, "sglang": _sglang, "tgi": _tgi}[now.spec.kind](now)


class _Page:
    def __init__(self, prefix: str, counter_suffix: str = "_total") -> None:
        self.prefix = prefix
        self.counter_suffix = counter_suffix
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_text: str, rows: Sequence[tuple[str, float]]) -> None:
        full = self.prefix + name
        if help_text:
            self.lines.append(f"# HELP {full} {help_text}")
        self.lines.append(f"# TYPE {full} {kind}")
        sample = full + (self.counter_suffix if kind == "counter" else "")
        for labels, value in rows:
            self.lines.append(f"{sample}{{{labels}}} {_num(value)}" if labels else f"{sample} {_num(value)}")

    def histogram(
        self, now: Instant, key: str, label_sets: Sequence[str], help_text: str = "", head: bool = True
    ) -> None:
        """One histogram; every label set (a rank) carries the same observations. `head`
        False: more series of the family just written."""
        name, bounds = HISTOGRAMS[now.spec.kind][key]
        full = self.prefix + name
        count, total, *buckets = now.hists[key]
        if help_text:
            self.lines.append(f"# HELP {full} {help_text}")
        if head:
            self.lines.append(f"# TYPE {full} histogram")
        for labels in label_sets:
            lb = "{" + labels + "}" if labels else ""
            sep = "," if labels else ""
            # observations are whole requests (transfers), as on a real server
            for bound, value in (*zip(bounds, buckets, strict=True), (math.inf, count)):
                le = "+Inf" if math.isinf(bound) else _num(bound)
                self.lines.append(
                    f'{full}_bucket{{{labels}{sep}le="{le}"}} {_num(math.floor(min(value, count)))}'
                )
            self.lines.append(f"{full}_sum{lb} {_num(total)}")
            self.lines.append(f"{full}_count{lb} {_num(math.floor(count))}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _finished(now: Instant) -> tuple[float, float]:
    return now.acc["ok"], now.acc["errors"]


# ---- vLLM ------------------------------------------------------------------------------


def _vllm(now: Instant) -> str:
    spec, v, acc = now.spec, now.value, now.acc
    model = _esc(spec.model)
    labels = f'engine="0",model_name="{model}"'
    p = _Page("vllm:")
    waiting = v("waiting")
    p.metric(
        "num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        [(labels, round(v("running")))],
    )
    p.metric(
        "num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        [(labels, round(waiting))],
    )
    p.metric(
        "num_requests_waiting_by_reason",
        "gauge",
        "Number of waiting requests by reason.",
        [(f'{labels},reason="capacity"', round(waiting)), (f'{labels},reason="deferred"', 0)],
    )
    p.metric(
        "kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        [(labels, min(v("kv_usage"), 1.0))],
    )
    p.metric(
        "prefix_cache_queries",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        [(labels, acc["prompt"])],
    )
    p.metric(
        "prefix_cache_hits",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        [(labels, acc["cached"])],
    )
    p.metric(
        "num_preemptions",
        "counter",
        "Cumulative number of preemption from the engine.",
        [(labels, acc["preemptions"])],
    )
    p.metric("prompt_tokens", "counter", "Number of prefill tokens processed.", [(labels, acc["prompt"])])
    p.metric(
        "prompt_tokens_cached",
        "counter",
        "Number of cached prompt tokens (local + external).",
        [(labels, acc["cached"])],
    )
    p.metric(
        "generation_tokens",
        "counter",
        "Number of generation tokens processed.",
        [(labels, acc["generation"])],
    )
    ok, errors = _finished(now)
    p.metric(
        "request_success",
        "counter",
        "Count of successfully processed requests.",
        [
            (f'engine="0",finished_reason="{reason}",model_name="{model}"', value)
            for reason, value in (
                ("stop", ok * 0.8),
                ("length", ok * 0.2),
                ("abort", 0.0),
                ("error", errors),
                ("repetition", 0.0),
            )
        ],
    )
    p.metric(
        "admission_rejections",
        "counter",
        "Number of admission attempts rejected by a queue limit, by reason.",
        [
            (f'model_name="{model}",reason="max_num_queued_reqs"', acc["rejections"]),
            (f'model_name="{model}",reason="max_num_queued_tokens"', 0.0),
        ],
    )
    if now.estimates:
        p.metric(
            "estimated_flops_per_gpu",
            "counter",
            "Estimated number of floating point operations per GPU (for Model Flops Utilization).",
            [(labels, acc["flops"])],
        )
        p.metric(
            "estimated_read_bytes_per_gpu",
            "counter",
            "Estimated number of bytes read from memory per GPU (for Model Bandwidth Utilization).",
            [(labels, acc["read_bytes"])],
        )
    if now.spec_decode:
        p.metric(
            "spec_decode_num_draft_tokens", "counter", "Number of draft tokens.", [(labels, acc["draft"])]
        )
        p.metric(
            "spec_decode_num_accepted_tokens",
            "counter",
            "Number of accepted tokens.",
            [(labels, acc["accepted"])],
        )
    hist_labels = f'engine="0",model_name="{model}"'
    for key, (name, _) in histograms_of(spec).items():
        if key in NIXL_KEYS:
            continue
        p.histogram(now, key, [hist_labels], f"Histogram of {name.replace('_', ' ')}.")
    if spec.role != "unified":
        nixl = f'model_name="{model}",engine="0"'
        p.histogram(now, "kv_transfer", [nixl], "Histogram of transfer duration for NIXL KV Cache transfers.")
        p.histogram(now, "kv_bytes", [nixl], "Histogram of bytes transferred per NIXL KV Cache transfers.")
        p.metric(
            "nixl_num_failed_transfers",
            "counter",
            "Number of failed NIXL KV Cache transfers.",
            [(nixl, acc["kv_failures"])],
        )
        p.metric(
            "nixl_num_failed_notifications",
            "counter",
            "Number of failed NIXL KV Cache notifications.",
            [(nixl, 0.0)],
        )
    cfg = {
        "block_size": str(spec.block_size),
        "cache_dtype": "auto",
        "enable_prefix_caching": "True",
        "engine": "0",
        "gpu_memory_utilization": repr(spec.gpu_memory_utilization),
        "num_gpu_blocks": str(spec.num_gpu_blocks),
        "kv_cache_size_tokens": str(spec.num_gpu_blocks * spec.block_size),
        "kv_cache_max_concurrency": repr(spec.num_gpu_blocks * spec.block_size / SIM_MAX_MODEL_LEN),
        "num_cpu_blocks": "None",
    }
    info = ",".join(f'{k}="{val}"' for k, val in sorted(cfg.items()))
    p.metric("cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", [(info, 1.0)])
    p.lines.append("# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.")
    p.lines.append("# TYPE process_cpu_seconds_total counter")
    p.lines.append(f"process_cpu_seconds_total {_num(acc['api_cpu'])}")
    return p.text()


# ---- SGLang ----------------------------------------------------------------------------


def _sglang(now: Instant) -> str:
    spec, v, acc = now.spec, now.value, now.acc
    model = _esc(spec.model)
    role = spec.role
    ranks = [
        f'model_name="{model}",engine_type="{role}",tp_rank="{r}",pp_rank="0",moe_ep_rank="0"'
        for r in range(max(len(spec.gpus), 1))
    ]
    tokens = spec.num_gpu_blocks * spec.block_size  # SGLang pages one token at a time
    usage = min(v("kv_usage"), 1.0)
    draft, accept, gen = v("spec_draft_tps"), min(v("spec_accept_ratio"), 1.0), v("gen_tps")
    # tokens per decoding step with speculation: L = 1 + accepted drafts per step, and
    # steps = gen / L, so L = 1 / (1 - accepted draft tokens per generated token)
    accepted_share = min(draft * accept / gen, 0.99) if gen else 0.0
    accept_length = 1.0 / (1.0 - accepted_share) if now.spec_decode else 0.0

    def own(key: str, side: str) -> float:
        return v(key) if role == side else 0.0

    p = _Page("sglang:")
    gauges: list[tuple[str, str, float]] = [
        ("num_running_reqs", "The number of running requests.", round(v("running"))),
        ("num_used_tokens", "The number of used tokens.", round(usage * tokens)),
        ("token_usage", "The token usage.", usage),
        ("gen_throughput", "The generation throughput (token/s).", gen),
        ("num_queue_reqs", "The number of requests in the waiting queue.", round(v("waiting"))),
        ("cache_hit_rate", "The prefix cache hit rate.", min(v("prefix_hit_ratio"), 1.0)),
        ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", tokens),
        ("spec_accept_length", "The average acceptance length of speculative decoding.", accept_length),
        (
            "spec_accept_rate",
            "The average acceptance rate of speculative decoding.",
            accept if now.spec_decode else 0.0,
        ),
        # retracted since the scheduler's last stats log, about a second of decoding
        ("num_retracted_reqs", "The number of retracted requests.", v("preemption_rate")),
        (
            "num_prefill_prealloc_queue_reqs",
            "The number of requests in the prefill prealloc queue.",
            round(own("prefill_bootstrap_queue", "prefill")),
        ),
        (
            "num_prefill_inflight_queue_reqs",
            "The number of requests in the prefill inflight queue.",
            round(own("prefill_inflight_queue", "prefill")),
        ),
        (
            "num_decode_prealloc_queue_reqs",
            "The number of requests in the decode prealloc queue.",
            round(own("decode_prealloc_queue", "decode")),
        ),
        (
            "num_decode_transfer_queue_reqs",
            "The number of requests in the decode transfer queue.",
            round(own("decode_transfer_queue", "decode")),
        ),
        (
            "kv_transfer_speed_gb_s",
            "The transfer speed of the KV cache in GB/s.",
            own("kv_transfer_gbps", "prefill"),
        ),
        (
            "kv_transfer_latency_ms",
            "The transfer latency of the KV cache in ms.",
            own("kv_transfer_s", "prefill") * 1e3,
        ),
    ]
    for name, help_text, value in gauges:
        p.metric(name, "gauge", help_text, [(r, value) for r in ranks])
    failures = acc["kv_failures"] if role == "prefill" else 0.0
    for name, help_text, value in (
        ("num_retracted_requests", "Total number of retracted requests.", acc["preemptions"]),
        ("num_bootstrap_failed_reqs", "The number of bootstrap failed requests.", 0.0),
        ("num_transfer_failed_reqs", "The number of transfer failed requests.", failures),
    ):
        p.metric(name, "counter", help_text, [(r, value) for r in ranks])
    p.histogram(now, "queue", ranks, "Histogram of queueing time in seconds.")
    ok, errors = _finished(now)
    tok = f'model_name="{model}"'
    for name, help_text, value in (
        ("prompt_tokens", "Number of prefill tokens processed.", acc["prompt"]),
        ("generation_tokens", "Number of generation tokens processed.", acc["generation"]),
        ("cached_tokens", "Number of cached prompt tokens.", acc["cached"]),
        ("num_requests", "Number of requests processed.", ok + errors),
        ("num_aborted_requests", "Number of requests aborted.", errors),
    ):
        p.metric(name, "counter", help_text, [(tok, value)])
    p.histogram(now, "ttft", [tok], "Histogram of time to first token in seconds.")
    p.histogram(now, "itl", [tok], "Histogram of inter-token latency in seconds.")
    p.histogram(now, "e2e", [tok], "Histogram of End-to-end request latency in seconds")
    return p.text()


# ---- TGI -------------------------------------------------------------------------------


def _tgi(now: Instant) -> str:
    spec, v, acc = now.spec, now.value, now.acc
    p = _Page("tgi_", counter_suffix="")
    ok, errors = _finished(now)
    p.metric("request_count", "counter", "", [("", ok + errors + acc["rejections"])])
    p.metric("request_success", "counter", "", [("", ok)])
    p.metric(
        "request_failure",
        "counter",
        "",
        [('err="overloaded"', acc["rejections"]), ('err="generation"', errors), ('err="validation"', 0.0)],
    )
    p.metric("queue_size", "gauge", "", [("", round(v("waiting")))])
    p.metric("batch_current_size", "gauge", "", [("", round(v("running")))])
    # tokens the running batch holds: its share of the KV blocks
    held = min(v("kv_usage"), 1.0) * spec.num_gpu_blocks * spec.block_size
    p.metric("batch_current_max_tokens", "gauge", "", [("", round(held))])
    for key in ("e2e", "queue", "itl_mean", "prompt_len", "gen_len"):
        p.histogram(now, key, [""])
    p.histogram(now, "batch_prefill", ['method="prefill"'])
    p.histogram(now, "batch_decode", ['method="decode"'], head=False)
    return p.text()


def _num(x: float) -> str:
    return repr(float(x))


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
