"""Engine readings: the llmgpu_engine_* metrics, engine-neutral.

One `Engines` reading sits in `snapshot.node`; it nests one `EngineTargetReading` per
scrape target, which nests one `EngineSeries` per (model, data-parallel rank) the target
reports. A field left `None` is a quantity the engine does not provide: its series is
absent. Fields without metric metadata (pids, url) travel with the reading for the
enrichers and the diagnosis and are never exported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from exporter.metricdef import Histogram, counter, gauge, histogram, info, label, nested, summary

ENGINE_KINDS = ("vllm", "sglang", "tgi")
ROLES = ("api_server", "engine_core", "worker")
# Reasons a scrape can fail; every target reports all of them from 0 on.
SCRAPE_ERRORS = (
    "dns",  # the target's host name does not resolve
    "refused",  # connection refused or host unreachable
    "timeout",  # no complete answer within the target's timeout
    "http_status",  # an answer other than 200
    "not_prometheus",  # HTML, garbage, or text the exposition parser rejects
    "too_large",  # body over engine_max_bytes, as sent or inflated
    "too_many_series",  # more samples than engine_max_series
    "too_many_labels",  # a series with more labels than engine_max_labels
    "label_too_long",  # a label value longer than engine_max_label_length
    "unknown_engine",  # valid exposition, but no vLLM / SGLang / TGI metric in it
    "bad_encoding",  # a Content-Encoding other than gzip, several of them, or gzip that does not inflate
    "connection",  # the connection broke mid-answer (reset, protocol error)
)
QUANTILES = (0.5, 0.95, 0.99)
WINDOWS = (("1m", 60.0), ("5m", 300.0))
RATE_WINDOW_S = 60.0  # window of the derived per-second rates and ratios


@dataclass(frozen=True)
class LatencyQuantile:
    window: str = label()
    quantile: str = label()
    ttft_seconds: float | None = summary(
        "llmgpu_engine_time_to_first_token_quantile_seconds",
        "Time-to-first-token quantile over the window, interpolated in the engine's histogram "
        "buckets (vllm:time_to_first_token_seconds, sglang:time_to_first_token_seconds)",
    )
    itl_seconds: float | None = summary(
        "llmgpu_engine_inter_token_latency_quantile_seconds",
        "Inter-token latency quantile over the window, interpolated in the engine's histogram "
        "buckets (vllm:inter_token_latency_seconds, sglang:inter_token_latency_seconds, "
        "tgi_request_mean_time_per_token_duration)",
    )


@dataclass(frozen=True, kw_only=True)
class EngineSeries:
    """What one engine reports for one model (and one data-parallel rank, where several)."""

    engine: str = label()
    model: str | None = label(None)
    dp: str | None = label(None)

    requests_running: float | None = gauge(
        "llmgpu_engine_requests_running",
        "Requests in the running batch (vllm:num_requests_running, sglang:num_running_reqs, "
        "tgi_batch_current_size)",
    )
    requests_waiting: float | None = gauge(
        "llmgpu_engine_requests_waiting",
        "Requests waiting to be scheduled (vllm:num_requests_waiting, sglang:num_queue_reqs, tgi_queue_size)",
    )
    requests_waiting_by_reason: dict[str, float] | None = gauge(
        "llmgpu_engine_requests_waiting_by_reason",
        "Waiting requests by why they wait (vllm:num_requests_waiting_by_reason)",
        label="reason",
    )
    kv_cache_usage_ratio: float | None = gauge(
        "llmgpu_engine_kv_cache_usage_ratio",
        "Fraction of the KV-cache blocks in use (vllm:kv_cache_usage_perc, "
        "vllm:gpu_cache_usage_perc, sglang:token_usage)",
    )
    preemptions: float | None = counter(
        "llmgpu_engine_preemptions_total",
        "Requests preempted to free KV cache (vllm:num_preemptions_total, "
        "sglang:num_retracted_requests_total)",
    )
    estimated_flops_per_gpu: float | None = counter(
        "llmgpu_engine_estimated_flops_per_gpu_total",
        "The engine's own estimate of floating-point operations per GPU, for MFU "
        "(vllm:estimated_flops_per_gpu_total)",
    )
    estimated_read_bytes_per_gpu: float | None = counter(
        "llmgpu_engine_estimated_read_bytes_per_gpu_total",
        "The engine's own estimate of bytes read from GPU memory per GPU, for MBU "
        "(vllm:estimated_read_bytes_per_gpu_total)",
    )
    prompt_tokens: float | None = counter(
        "llmgpu_engine_prompt_tokens_total",
        "Prompt (prefill) tokens processed (vllm:prompt_tokens_total, sglang:prompt_tokens_total, "
        "tgi_request_input_length_sum)",
    )
    generation_tokens: float | None = counter(
        "llmgpu_engine_generation_tokens_total",
        "Tokens generated (vllm:generation_tokens_total, sglang:generation_tokens_total, "
        "tgi_request_generated_tokens_sum)",
    )
    prompt_tokens_cached: float | None = counter(
        "llmgpu_engine_prompt_tokens_cached_total",
        "Prompt tokens served from the prefix cache (vllm:prompt_tokens_cached_total, "
        "sglang:cached_tokens_total)",
    )
    requests: dict[str, float] | None = counter(
        "llmgpu_engine_requests_total",
        "Finished requests by finish reason (vllm:request_success_total, "
        "sglang:num_requests_total, tgi_request_success, tgi_request_failure)",
        label="finish_reason",
    )
    rejected_requests: float | None = counter(
        "llmgpu_engine_rejected_requests_total",
        "Requests refused at admission (vllm:admission_rejections_total, "
        'tgi_request_failure{err="overloaded"})',
    )
    prefix_cache_queries: float | None = counter(
        "llmgpu_engine_prefix_cache_queries_total",
        "Prompt tokens looked up in the prefix cache (vllm:prefix_cache_queries_total, "
        "vllm:gpu_prefix_cache_queries_total)",
    )
    prefix_cache_hits: float | None = counter(
        "llmgpu_engine_prefix_cache_hits_total",
        "Prompt tokens found in the prefix cache (vllm:prefix_cache_hits_total, "
        "vllm:gpu_prefix_cache_hits_total)",
    )
    spec_decode_draft_tokens: float | None = counter(
        "llmgpu_engine_spec_decode_draft_tokens_total",
        "Speculative-decoding draft tokens proposed (vllm:spec_decode_num_draft_tokens_total)",
    )
    spec_decode_accepted_tokens: float | None = counter(
        "llmgpu_engine_spec_decode_accepted_tokens_total",
        "Speculative-decoding draft tokens accepted (vllm:spec_decode_num_accepted_tokens_total)",
    )
    ttft: Histogram | None = histogram(
        "llmgpu_engine_time_to_first_token_seconds",
        "Time to first token, in the engine's buckets (vllm:time_to_first_token_seconds, "
        "sglang:time_to_first_token_seconds)",
    )
    itl: Histogram | None = histogram(
        "llmgpu_engine_inter_token_latency_seconds",
        "Inter-token latency, in the engine's buckets (vllm:inter_token_latency_seconds, "
        "vllm:time_per_output_token_seconds, sglang:inter_token_latency_seconds, "
        "tgi_request_mean_time_per_token_duration)",
    )
    e2e: Histogram | None = histogram(
        "llmgpu_engine_e2e_request_latency_seconds",
        "End-to-end request latency, in the engine's buckets (vllm:e2e_request_latency_seconds, "
        "sglang:e2e_request_latency_seconds, tgi_request_duration)",
    )
    queue: Histogram | None = histogram(
        "llmgpu_engine_queue_time_seconds",
        "Time requests spent waiting, in the engine's buckets (vllm:request_queue_time_seconds, "
        "sglang:queue_time_seconds, tgi_request_queue_duration)",
    )
    prefill: Histogram | None = histogram(
        "llmgpu_engine_prefill_time_seconds",
        "Time requests spent in prefill, in the engine's buckets (vllm:request_prefill_time_seconds)",
    )
    decode: Histogram | None = histogram(
        "llmgpu_engine_decode_time_seconds",
        "Time requests spent in decode, in the engine's buckets (vllm:request_decode_time_seconds)",
    )
    # prefill/decode disaggregation: SGLang's PD queues, the KV connector's transfers
    disagg_queue_requests: dict[str, float] | None = gauge(
        "llmgpu_engine_disagg_queue_requests",
        "Requests in a prefill/decode disaggregation queue: prefill_bootstrap (waiting for the decode "
        "side to reserve KV memory), prefill_inflight (KV being sent), decode_prealloc (waiting for KV "
        "memory), decode_transfer (waiting for the KV cache to arrive) "
        "(sglang:num_prefill_prealloc_queue_reqs, sglang:num_prefill_inflight_queue_reqs, "
        "sglang:num_decode_prealloc_queue_reqs, sglang:num_decode_transfer_queue_reqs)",
        label="queue",
    )
    kv_transfer_failures: float | None = counter(
        "llmgpu_engine_kv_transfer_failures_total",
        "KV-cache transfers between prefill and decode that failed (sglang:num_transfer_failed_reqs_total, "
        "sglang:num_bootstrap_failed_reqs_total, vllm:nixl_num_failed_transfers_total)",
    )
    kv_transfer_bytes: float | None = counter(
        "llmgpu_engine_kv_transfer_bytes_total",
        "Bytes of KV cache the connector moved between prefill and decode (vllm:nixl_bytes_transferred_sum)",
    )
    kv_transfer: Histogram | None = histogram(
        "llmgpu_engine_kv_transfer_seconds",
        "Duration of KV-cache transfers between prefill and decode, in the connector's buckets "
        "(vllm:nixl_xfer_time_seconds)",
    )
    cache_config: dict[str, str] | None = info(
        "llmgpu_engine_cache_config_info",
        "The engine's KV-cache configuration: block size, GPU blocks, gpu_memory_utilization "
        "(vllm:cache_config_info, sglang:max_total_num_tokens)",
    )

    # derived over RATE_WINDOW_S of scrapes, in Context.clock seconds
    prompt_tokens_per_second: float | None = gauge(
        "llmgpu_engine_prompt_tokens_per_second",
        "Prompt tokens per second over the last minute (derived from the engine's prompt-token counter)",
    )
    generation_tokens_per_second: float | None = gauge(
        "llmgpu_engine_generation_tokens_per_second",
        "Generated tokens per second over the last minute (derived from the engine's "
        "generation-token counter)",
    )
    request_rate_per_second: float | None = gauge(
        "llmgpu_engine_request_rate_per_second",
        "Offered requests per second over the last minute: finished plus rejected plus the "
        "growth of running and waiting (tgi_request_count where the engine counts arrivals)",
    )
    preemptions_per_second: float | None = gauge(
        "llmgpu_engine_preemptions_per_second",
        "Preemptions per second over the last minute (derived from the preemption counter)",
    )
    prefix_cache_hit_ratio: float | None = gauge(
        "llmgpu_engine_prefix_cache_hit_ratio",
        "Prefix-cache hits over queries in the last minute (derived; sglang:cache_hit_rate as reported)",
    )
    spec_decode_acceptance_ratio: float | None = gauge(
        "llmgpu_engine_spec_decode_acceptance_ratio",
        "Accepted over proposed draft tokens in the last minute (derived; sglang:spec_accept_rate "
        "as reported)",
    )
    kv_transfer_latency_seconds: float | None = gauge(
        "llmgpu_engine_kv_transfer_latency_seconds",
        "Time one request's KV cache takes to move from prefill to decode: the mean over the last "
        "minute (vllm:nixl_xfer_time_seconds), else as reported (sglang:kv_transfer_latency_ms, "
        "prefill side)",
    )
    kv_transfer_speed_bytes_per_second: float | None = gauge(
        "llmgpu_engine_kv_transfer_speed_bytes_per_second",
        "KV-cache transfer speed: bytes over transfer time in the last minute (vllm:nixl_bytes_transferred, "
        "vllm:nixl_xfer_time_seconds), else as reported (sglang:kv_transfer_speed_gb_s, prefill side)",
    )
    latency_quantiles: tuple[LatencyQuantile, ...] = nested(LatencyQuantile)

    @property
    def gpu_memory_utilization(self) -> float | None:
        """The engine's own share of GPU memory (vLLM's budget), if it reports one."""
        return _number((self.cache_config or {}).get("gpu_memory_utilization"))

    @property
    def num_gpu_blocks(self) -> int | None:
        value = _number((self.cache_config or {}).get("num_gpu_blocks"))
        return None if value is None else int(value)

    @property
    def kv_cache_max_concurrency(self) -> float | None:
        """Requests of the full context length the KV cache holds at once (vLLM 0.32)."""
        return _number((self.cache_config or {}).get("kv_cache_max_concurrency"))

    @property
    def block_size(self) -> int | None:
        value = _number((self.cache_config or {}).get("block_size"))
        return None if value is None else int(value)

    def quantile(self, metric: str, q: float, window: str = "1m") -> float | None:
        """`metric` is "ttft" or "itl"; None when the window saw no request."""
        for item in self.latency_quantiles:
            if item.window == window and float(item.quantile) == q:
                value: float | None = getattr(item, f"{metric}_seconds")
                return value
        return None


def _number(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


@dataclass(frozen=True, kw_only=True)
class EngineUp:
    engine: str = label()
    model: str | None = label(None)
    up: int | None = gauge(
        "llmgpu_engine_up",
        "1 when the last scrape of the engine's /metrics succeeded and was understood, else 0",
    )


@dataclass(frozen=True)
class ProcessCpu:
    role: str = label()
    cpu_ratio: float | None = gauge(
        "llmgpu_engine_process_cpu_ratio",
        "CPU use of the engine's busiest process of this role, one full core = 1 (psutil "
        "Process.cpu_times; else the API server's own process_cpu_seconds_total)",
    )


@dataclass(frozen=True, kw_only=True)
class EngineTargetReading:
    """One scrape target: its health, its self-metrics and what it reported."""

    target: str = label()
    status: tuple[EngineUp, ...] = nested(EngineUp)
    scrape_duration_seconds: float | None = gauge(
        "llmgpu_engine_scrape_duration_seconds", "Wall time of the last scrape of the engine's /metrics"
    )
    scrape_errors: dict[str, int] | None = counter(
        "llmgpu_engine_scrape_errors_total",
        "Failed scrapes of the engine's /metrics by reason (every reason present from 0)",
        label="reason",
    )
    series_count: int | None = gauge(
        "llmgpu_engine_series", "Samples on the engine's /metrics page at the last good scrape"
    )
    dropped_models: int | None = gauge(
        "llmgpu_engine_dropped_models",
        "Models on the engine's last good page past engine_max_models, left out (0: none)",
    )
    processes: tuple[ProcessCpu, ...] = nested(ProcessCpu)
    series: tuple[EngineSeries, ...] = nested(EngineSeries)
    # the engine's own limits, where its target declares them (vLLM reports neither)
    max_num_seqs: int | None = gauge(
        "llmgpu_engine_max_num_seqs",
        "Sequences the engine batches at most, as declared with its target (max_num_seqs)",
    )
    max_num_batched_tokens: int | None = gauge(
        "llmgpu_engine_max_num_batched_tokens",
        "Tokens the engine schedules per step at most, as declared with its target (max_num_batched_tokens)",
    )

    # not exported
    url: str = ""
    kind: str | None = None  # vllm, sglang, tgi; None while unknown
    source: str = "static"  # static, process, kubernetes
    pids: frozenset[int] = field(default_factory=frozenset)  # the engine's process tree
    cpu_numa_nodes: tuple[int, ...] | None = None  # NUMA nodes its GPU-driving CPUs are on
    last_error: str | None = None
    scraped_at: float | None = None  # Context.clock of the last good scrape

    @property
    def up(self) -> bool:
        return any(s.up == 1 for s in self.status)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted({s.model for s in self.series if s.model}))


@dataclass(frozen=True)
class Engines:
    """Every engine target on the node: the engines collector's node reading."""

    family: ClassVar[str] = "engines"
    targets: tuple[EngineTargetReading, ...] = nested(EngineTargetReading)

    def target(self, name: str) -> EngineTargetReading | None:
        return next((t for t in self.targets if t.target == name), None)


@dataclass(frozen=True, kw_only=True)
class EngineGpu:
    engine: str = label()
    target: str = label()
    model: str | None = label(None)
    uuid: str = label()
    gpu: str = label()
    present: int | None = gauge(
        "llmgpu_engine_gpu_info",
        "1 for each GPU an engine runs on: NVML compute-process pids "
        "(nvmlDeviceGetComputeRunningProcesses) matched against the engine's process tree",
    )
    memory_budget_bytes: float | None = gauge(
        "llmgpu_engine_gpu_memory_budget_bytes",
        "The engine's own memory budget on this GPU: gpu_memory_utilization times total memory "
        "(vllm:cache_config_info, nvmlDeviceGetMemoryInfo)",
    )


@dataclass(frozen=True)
class EngineGpus:
    """The join table between engines and GPUs, added to the snapshot by an enricher."""

    family: ClassVar[str] = "engine_gpus"
    links: tuple[EngineGpu, ...] = nested(EngineGpu)

    def gpus_of(self, target: str) -> tuple[int, ...]:
        return tuple(sorted({int(link.gpu) for link in self.links if link.target == target}))
