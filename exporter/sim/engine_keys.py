"""What a scenario can say about an engine: its kind, its role, the quantities a phase sets.

The simulated engine (sim/engines.py) integrates these quantities and writes them in the
page of its kind (sim/engine_pages.py); docs/scenarios.md lists them.
"""

from __future__ import annotations

KINDS = ("vllm", "sglang", "tgi")  # whose /metrics page the simulated engine serves
# Prefill/decode disaggregation: a unified engine does both; a prefill engine hands each
# request's KV cache to a decode engine (SGLang's engine_type label, vLLM's KV connector).
ROLES = ("unified", "prefill", "decode")

# Per-engine quantities a phase may set; the simulated engines read them.
ENGINE_KEYS: dict[str, float] = {
    "request_rate": 0.0,  # offered requests per second
    "running": 0.0,
    "waiting": 0.0,
    "kv_usage": 0.0,  # ratio
    "preemption_rate": 0.0,
    "prompt_tps": 0.0,  # prompt tokens per second
    "gen_tps": 0.0,  # generated tokens per second
    "prefix_hit_ratio": 0.0,
    "spec_accept_ratio": 0.0,  # 0 = no speculative decoding
    "spec_draft_tps": 0.0,
    "ttft_s": 0.05,  # median time to first token
    "itl_s": 0.02,  # median inter-token latency
    "itl_jitter": 2.0,  # p99 / p50 of the inter-token latency
    "e2e_s": 1.0,
    "queue_s": 0.0,
    "api_cpu": 0.2,  # API-server process CPU, one core = 1
    "error_ratio": 0.0,  # fraction of requests that fail
    "rejection_rate": 0.0,  # admissions refused per second
    # the engine's own FLOP and byte estimates (vLLM's estimated_*_per_gpu_total): per GPU
    # per second; the page carries them only when a phase sets one
    "flops_per_gpu": 0.0,
    "read_bytes_per_gpu": 0.0,
    # PyTorch caching allocator of each worker, written as allocator probe files
    # (exporter/sim/probes.py) only when a phase sets alloc_reserved_bytes
    "alloc_reserved_bytes": 0.0,
    "alloc_free_bytes": 0.0,  # free inside the reserved segments
    "alloc_largest_free_bytes": 0.0,  # the largest free block among them
    "alloc_retry_rate": 0.0,  # allocations retried after flushing the cache, per second
    "alloc_oom_rate": 0.0,  # allocator out-of-memory errors per second
    # disaggregation, read only on an engine whose role has them: the median KV transfer of
    # one request and its speed (prefill side in SGLang, the pulling decode side in vLLM),
    # failed transfers per second, and SGLang's four disaggregation queues (requests)
    "kv_transfer_s": 0.0,
    "kv_transfer_gbps": 0.0,  # GB/s
    "kv_transfer_failure_rate": 0.0,
    "prefill_bootstrap_queue": 0.0,  # prefill: waiting for the decode side to reserve KV
    "prefill_inflight_queue": 0.0,  # prefill: KV being sent
    "decode_prealloc_queue": 0.0,  # decode: waiting for KV memory to reserve
    "decode_transfer_queue": 0.0,  # decode: KV reserved, waiting for it to arrive
}

_DISAGG_QUEUES = ("prefill_bootstrap_queue", "prefill_inflight_queue", "decode_prealloc_queue")
_NO_TRANSFER = (*_DISAGG_QUEUES, "decode_transfer_queue", "kv_transfer_s", "kv_transfer_gbps")
# Quantities a kind's page has no family for: a scenario that sets one for an engine of
# that kind is refused, rather than the value silently going nowhere.
NOT_ON_PAGE: dict[str, frozenset[str]] = {
    "vllm": frozenset(_DISAGG_QUEUES) | {"decode_transfer_queue"},  # SGLang's queues
    # no admission limit, no FLOP estimates; multiprocess metrics carry no process CPU
    "sglang": frozenset({"rejection_rate", "flops_per_gpu", "read_bytes_per_gpu", "api_cpu"}),
    # the router knows its queue and batch, not the KV cache, prefill or the first token
    "tgi": frozenset(
        {
            "preemption_rate",
            "prefix_hit_ratio",
            "spec_accept_ratio",
            "spec_draft_tps",
            "ttft_s",
            "api_cpu",
            "flops_per_gpu",
            "read_bytes_per_gpu",
            "kv_transfer_failure_rate",
            *_NO_TRANSFER,
        }
    ),
}
