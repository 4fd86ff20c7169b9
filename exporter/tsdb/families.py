"""The metric families a frame is rebuilt from: one range query each.

Every field of `GpuFrame` and `EngineFrame` that the exporter exports comes from one of
these (see `exporter/tsdb/frames.py` for which). A family is fetched for every node of
the selection at once; the extra matchers keep only the series the frame reads (the
one-minute latency quantiles, the API-server process).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    matchers: str = ""  # extra label matchers, PromQL syntax without braces


NODE = (
    Family("llmgpu_exporter_build_info"),  # one per scrape that answered: the node's timeline
    Family("llmgpu_exporter_simulated"),
)
GPU = (
    Family("llmgpu_gpu_up"),
    Family("llmgpu_gpu_info"),
    Family("llmgpu_gpu_metric_supported", 'family="nvlink"'),
    Family("llmgpu_gpu_memory_total_bytes"),
    Family("llmgpu_gpu_memory_used_bytes"),
    Family("llmgpu_gpu_memory_free_bytes"),
    Family("llmgpu_gpu_utilization_ratio"),
    Family("llmgpu_gpu_sm_active_ratio"),
    Family("llmgpu_gpu_tensor_active_ratio"),
    Family("llmgpu_gpu_dram_active_ratio"),
    Family("llmgpu_gpu_dram_bandwidth_peak_bytes_per_second"),
    Family("llmgpu_gpu_sm_clock_hertz"),
    Family("llmgpu_gpu_sm_clock_max_hertz"),
    Family("llmgpu_gpu_clock_event_active"),
    Family("llmgpu_gpu_power_watts"),
    Family("llmgpu_gpu_energy_joules_total"),
    Family("llmgpu_gpu_power_limit_watts"),
    Family("llmgpu_gpu_temperature_celsius"),
    Family("llmgpu_gpu_pcie_replays_total"),
    Family("llmgpu_gpu_nvlink_links_up"),
    Family("llmgpu_gpu_nvlink_tx_bytes_per_second"),
    Family("llmgpu_gpu_nvlink_rx_bytes_per_second"),
    Family("llmgpu_gpu_nvlink_tx_bytes_total"),
    Family("llmgpu_gpu_nvlink_rx_bytes_total"),
    Family("llmgpu_gpu_ecc_uncorrected_errors_total"),
    Family("llmgpu_gpu_row_remap_failed"),
    Family("llmgpu_gpu_xid_errors_total"),
    Family("llmgpu_gpu_process_memory_used_bytes"),
    Family("llmgpu_gpu_processes"),
    Family("llmgpu_gpu_mig_enabled"),
    Family("llmgpu_gpu_mig_memory_used_bytes"),
    Family("llmgpu_gpu_mig_memory_total_bytes"),
)
ALLOCATOR = (
    Family("llmgpu_allocator_reserved_bytes"),
    Family("llmgpu_allocator_allocated_bytes"),
    Family("llmgpu_allocator_free_bytes"),
    Family("llmgpu_allocator_largest_free_block_bytes"),
    Family("llmgpu_allocator_fragmentation_ratio"),
    Family("llmgpu_allocator_alloc_retries_total"),
    Family("llmgpu_allocator_ooms_total"),
)
ENGINE = (
    Family("llmgpu_engine_up"),
    Family("llmgpu_engine_gpu_info"),
    Family("llmgpu_engine_requests_running"),
    Family("llmgpu_engine_requests_waiting"),
    Family("llmgpu_engine_kv_cache_usage_ratio"),
    Family("llmgpu_engine_preemptions_total"),
    Family("llmgpu_engine_preemptions_per_second"),
    Family("llmgpu_engine_generation_tokens_per_second"),
    Family("llmgpu_engine_prompt_tokens_per_second"),
    Family("llmgpu_engine_request_rate_per_second"),
    Family("llmgpu_engine_rejected_requests_total"),
    Family("llmgpu_engine_spec_decode_acceptance_ratio"),
    Family("llmgpu_engine_time_to_first_token_quantile_seconds", 'window="1m"'),
    Family("llmgpu_engine_inter_token_latency_quantile_seconds", 'window="1m"'),
    Family("llmgpu_engine_cache_config_info"),
    Family("llmgpu_engine_process_cpu_ratio", 'role="api_server"'),
    Family("llmgpu_engine_estimated_flops_per_gpu_total"),
    Family("llmgpu_engine_estimated_read_bytes_per_gpu_total"),
    Family("llmgpu_engine_requests_waiting_by_reason", 'reason="deferred"'),
    Family("llmgpu_engine_max_num_seqs"),
    Family("llmgpu_engine_generation_tokens_total"),
    Family("llmgpu_engine_max_num_batched_tokens"),
)
FAMILIES: tuple[Family, ...] = (*NODE, *GPU, *ALLOCATOR, *ENGINE)
TIMELINE = "llmgpu_exporter_build_info"


def selector(family: Family, matchers: str) -> str:
    """`name{matchers, family matchers}`."""
    inner = ", ".join(m for m in (matchers, family.matchers) if m)
    return f"{family.name}{{{inner}}}" if inner else family.name
