"""Diagnosis: findings of all seven layers over time, the OOM-risk score, the evidence of each rule.

Thresholds drawn in and quoted in panel texts come from exporter.diagnosis.thresholds.
"""

from __future__ import annotations

from dashboards.common import (
    GPU,
    NODE,
    ON_GPU,
    PROBE_ONLY,
    Row,
    cluster_var,
    custom_var,
    divide,
    gpu_var,
    node_var,
    q,
    rate,
    stat,
    state_timeline,
    table,
    timeseries,
)
from dashboards.common import (
    dashboard as make_dashboard,
)
from exporter.diagnosis.model import LAYERS
from exporter.diagnosis.thresholds import DEFAULT as TH

F = f'{NODE}, layer=~"$layer"'
ENG = f"{NODE}"
THROTTLE = 'reason=~"sw_thermal|hw_thermal|hw_slowdown|sw_power_cap|hw_power_brake"'
XID_FATAL = f'xid=~"{"|".join(str(x) for x in TH.xid_fatal)}"'
Q1M = 'window="1m"'


def pct(ratio: float) -> str:
    """A threshold as the panel texts write it: 0.95 -> '95 %'."""
    return f"{ratio * 100:g} %"


def on_engine_gpus(metric: str) -> str:
    return f"llmgpu_engine_gpu_info{{{ENG}}}\n* {ON_GPU} group_left ()\n{metric}"


findings = Row(
    "Findings",
    [
        stat(
            "Active findings",
            "Rules holding now on the selected nodes and layers.",
            [q(f"sum(llmgpu_diagnosis_finding{{{F}}})")],
            steps=(("green", None), ("orange", 1)),
            w=4,
        ),
        stat(
            "By severity",
            "Active findings by the rule's severity (critical, warning, info).",
            [q(f"sum by (severity) (llmgpu_diagnosis_finding{{{F}}})", "{{severity}}")],
            text_mode="value_and_name",
            w=8,
        ),
        stat(
            "Highest OOM-risk score",
            f"Highest OOM-risk score of the selected GPUs. At {TH.oom_finding_ratio:g} the memory/oom_risk "
            f"finding "
            "fires and LlmGpuOomRiskHigh pages after 2 minutes.",
            [q(f"max(llmgpu_diagnosis_oom_risk_ratio{{{GPU}}})")],
            unit="percentunit",
            steps=(("green", None), ("orange", TH.oom_finding_ratio / 2), ("red", TH.oom_finding_ratio)),
            graph=True,
            w=4,
        ),
        table(
            "Findings now",
            "Every rule holding now, with its subject: a GPU, an engine target, or both.",
            [
                q(
                    f"llmgpu_diagnosis_finding{{{F}}} == 1",
                    instant=True,
                    fmt="table",
                    scenarios=("sm-saturation", "kv-pressure", "power-capped", "small-batches"),
                )
            ],
            hide=("Time", "__name__", "job", "cluster", "Value"),
            w=8,
            h=8,
        ),
        timeseries(
            "Findings over time per layer",
            "Findings holding per layer. A band that appears with a scenario or an incident "
            "names the layer to look at first.",
            [q(f"sum by (layer) (llmgpu_diagnosis_finding{{{F}}})", "{{layer}}")],
            stack=True,
            w=12,
        ),
        timeseries(
            "Findings over time per rule",
            "Findings holding per rule (rules that never fired are left out).",
            [
                q(
                    f"sum by (layer, rule) (llmgpu_diagnosis_finding{{{F}}}) > 0",
                    "{{rule}}",
                    scenarios=("sm-saturation", "kv-pressure", "fp32-fallback", "scheduler-bound"),
                )
            ],
            stack=True,
            bars=True,
            w=12,
        ),
        state_timeline(
            "Findings timeline",
            "When each rule held, per subject; only rules that fired in the time range are drawn.",
            [
                q(
                    f"llmgpu_diagnosis_finding{{{F}}}\nand\n"
                    f"(max_over_time(llmgpu_diagnosis_finding{{{F}}}[$__range]) == 1)",
                    "{{rule}} gpu={{gpu}} target={{target}}",
                    scenarios=("sm-saturation", "kv-pressure", "spec-decode", "oom-crash"),
                )
            ],
        ),
    ],
)

oom = Row(
    "Memory layer: OOM risk",
    [
        timeseries(
            "OOM-risk score",
            "Out-of-memory risk per GPU and engine, 0-1, combining free-memory trend, usage over "
            "the engine's budget, allocator fragmentation and GPU sharing "
            "(1 - product of 1 - weight). The dashed line is the finding level.",
            [q(f"llmgpu_diagnosis_oom_risk_ratio{{{GPU}}}", "GPU {{gpu}} {{target}}")],
            unit="percentunit",
            min_=0,
            max_=1,
            threshold=TH.oom_finding_ratio,
        ),
        timeseries(
            "Evidence: free memory and its trend",
            f"Free framebuffer over the total (low headroom under {pct(TH.oom_free_margin_ratio)}), and "
            f"where it is "
            f"headed in {TH.oom_time_to_full_horizon_s / 60:g} minutes at the trend of the last "
            f"{TH.oom_trend_window_s / 60:g} (below 0: full before then).",
            [
                q(
                    divide(
                        f"llmgpu_gpu_memory_free_bytes{{{GPU}}}", f"llmgpu_gpu_memory_total_bytes{{{GPU}}}"
                    ),
                    "GPU {{gpu}} free",
                ),
                q(
                    divide(
                        f"predict_linear(llmgpu_gpu_memory_free_bytes{{{GPU}}}"
                        f"[{TH.oom_trend_window_s / 60:g}m], {TH.oom_time_to_full_horizon_s:g})",
                        f"llmgpu_gpu_memory_total_bytes{{{GPU}}}",
                    ),
                    f"GPU {{{{gpu}}}} free in {TH.oom_time_to_full_horizon_s / 60:g} min",
                ),
            ],
            unit="percentunit",
            max_=1,
            threshold=TH.oom_free_margin_ratio,
        ),
        timeseries(
            "Evidence: KV cache and preemptions (memory/kv_cache_saturated)",
            f"KV-cache usage (rule: {pct(TH.kv_usage_min_ratio)}) and preemptions per minute (rule: "
            f"{TH.kv_preemptions_min_per_second * 60:g} per minute). KV usage of "
            f"{pct(TH.kv_leak_min_ratio)} or more while nothing runs or waits is memory/kv_cache_leak.",
            [
                q(f"llmgpu_engine_kv_cache_usage_ratio{{{ENG}}}", "{{target}} KV usage"),
                q(f"60 * {rate('llmgpu_engine_preemptions_total', ENG)}", "{{target}} preemptions/min"),
            ],
        ),
        timeseries(
            "Evidence: allocator fragmentation (memory/allocator_fragmentation)",
            f"Largest free block of the engine's allocator against the {TH.oom_typical_request_bytes >> 20} "
            f"MiB a full batch's "
            "activations need, and the fragmentation ratio.",
            [
                q(
                    f"llmgpu_allocator_largest_free_block_bytes{{{GPU}}}",
                    "GPU {{gpu}} pid {{pid}} largest block",
                    scenarios=PROBE_ONLY,
                ),
                q(
                    f"llmgpu_allocator_fragmentation_ratio{{{GPU}}}",
                    "GPU {{gpu}} pid {{pid}} fragmentation",
                    scenarios=PROBE_ONLY,
                ),
            ],
        ),
        timeseries(
            "Evidence: burst headroom (memory/burst_headroom)",
            f"Free memory of each GPU against the room its engines' budget leaves (1 - their "
            f"gpu_memory_utilization, per engine and GPU). Where that room is "
            f"{pct(TH.headroom_planned_min_ratio)} or more, free memory under "
            f"{pct(TH.headroom_kept_min_share)} of it for {TH.headroom_hold_s / 60:g} minutes "
            "is the finding.",
            [
                q(
                    divide(
                        f"llmgpu_gpu_memory_free_bytes{{{GPU}}}", f"llmgpu_gpu_memory_total_bytes{{{GPU}}}"
                    ),
                    "GPU {{gpu}} free",
                ),
                q(
                    f"1 - llmgpu_engine_gpu_memory_budget_bytes{{{ENG}}}\n/ {ON_GPU} group_left ()\n"
                    f"llmgpu_gpu_memory_total_bytes{{{GPU}}}",
                    "GPU {{gpu}} {{target}} room left by the budget",
                ),
            ],
            unit="percentunit",
            min_=0,
            max_=1,
        ),
        timeseries(
            "Evidence: memory faults (memory/xid_memory_fault)",
            "XID 31 (MMU fault) and 43 (GPU stopped processing) in each interval, and OOMs the "
            "allocator probe saw.",
            [
                q(
                    "sum by (gpu, xid) (\n"
                    f'  increase(llmgpu_gpu_xid_errors_total{{{GPU}, xid=~"31|43"}}[$__rate_interval])\n)',
                    "GPU {{gpu}} XID {{xid}}",
                    scenarios=("healthy", "oom-crash"),
                ),
                q(
                    f"sum by (gpu) (increase(llmgpu_allocator_ooms_total{{{GPU}}}[$__rate_interval]))",
                    "GPU {{gpu}} allocator OOMs",
                    scenarios=PROBE_ONLY,
                ),
            ],
            bars=True,
        ),
        timeseries(
            "Evidence: processes sharing a GPU (OOM risk: sharing)",
            "Compute processes per GPU; several outside MIG each assume the memory is theirs.",
            [q(f"llmgpu_gpu_processes{{{GPU}}}", "GPU {{gpu}}")],
        ),
    ],
)

hardware = Row(
    "Hardware layer",
    [
        timeseries(
            "Evidence: busy but idle SMs (hardware/busy_idle_sms)",
            f"NVML utilization (rule: at least {pct(TH.busy_util_min_ratio)}) against SM active (rule: under "
            f"{pct(TH.busy_sm_active_max_ratio)}).",
            [
                q(
                    f"llmgpu_gpu_utilization_ratio{{{GPU}}}",
                    "GPU {{gpu}} utilization",
                    scenarios=("healthy", "small-batches"),
                ),
                q(
                    f"llmgpu_gpu_sm_active_ratio{{{GPU}}}",
                    "GPU {{gpu}} SM active",
                    scenarios=("healthy", "small-batches"),
                ),
            ],
            unit="percentunit",
            min_=0,
            max_=1,
        ),
        timeseries(
            "Evidence: DRAM bandwidth (hardware/dram_bandwidth_bound)",
            f"DRAM bandwidth over peak; the rule fires at {pct(TH.dram_bound_ratio)}.",
            [
                q(
                    f"llmgpu_gpu_dram_active_ratio{{{GPU}}}",
                    "GPU {{gpu}}",
                    scenarios=("healthy", "decode-memory-bound"),
                )
            ],
            unit="percentunit",
            min_=0,
            max_=1,
            threshold=TH.dram_bound_ratio,
        ),
        timeseries(
            "Evidence: throttling (hardware/thermal_throttle, hardware/power_throttle)",
            "Clock-event reasons active now, and the SM clock over its maximum (the power rule "
            f"needs it under {pct(TH.power_throttle_clock_max_ratio)}).",
            [
                q(
                    f"llmgpu_gpu_clock_event_active{{{GPU}, {THROTTLE}}} == 1",
                    "GPU {{gpu}} {{reason}}",
                    scenarios=("thermal-throttle", "power-capped"),
                ),
                q(
                    divide(f"llmgpu_gpu_sm_clock_hertz{{{GPU}}}", f"llmgpu_gpu_sm_clock_max_hertz{{{GPU}}}"),
                    "GPU {{gpu}} SM clock / max",
                ),
            ],
            min_=0,
        ),
        timeseries(
            "Evidence: PCIe replays (hardware/pcie_replays)",
            f"PCIe replays per minute (rule: {TH.pcie_replays_per_minute:g} per minute over "
            f"{TH.pcie_replay_window_s / 60:g} minutes).",
            [
                q(
                    f"60 * rate(llmgpu_gpu_pcie_replays_total{{{GPU}}}[{TH.pcie_replay_window_s / 60:g}m])",
                    "GPU {{gpu}}",
                    scenarios=("healthy", "pcie-tensor-parallel"),
                )
            ],
            w=8,
        ),
        table(
            "Evidence: GPU NUMA nodes (hardware/numa_mismatch)",
            "The NUMA node and PCI address of each GPU. The rule compares it with the NUMA "
            "nodes of the CPUs the engine's processes may run on, which the exporter's "
            "diagnosis page shows beside the finding.",
            [q(f"llmgpu_gpu_info{{{GPU}}}", instant=True, fmt="table")],
            hide=(
                "Time",
                "__name__",
                "job",
                "cluster",
                "Value",
                "cuda_version",
                "driver_version",
                "persistence_mode",
                "mig_mode",
            ),
            w=4,
        ),
        timeseries(
            "Evidence: GPU errors (hardware/gpu_lost, hardware/xid_fatal, hardware/ecc_uncorrectable)",
            "GPUs not answering NVML, fatal XIDs and uncorrectable ECC errors in each interval.",
            [
                q(f"1 - llmgpu_gpu_up{{{GPU}}}", "GPU {{gpu}} not answering"),
                q(
                    "sum by (gpu, xid) (\n"
                    f"  increase(llmgpu_gpu_xid_errors_total{{{GPU}, {XID_FATAL}}}[$__rate_interval])\n) > 0",
                    "GPU {{gpu}} XID {{xid}}",
                    scenarios=("gpu-lost",),
                ),
                q(
                    f"increase(llmgpu_gpu_ecc_uncorrected_errors_total{{{GPU}}}[$__rate_interval]) > 0",
                    "GPU {{gpu}} uncorrected ECC",
                    scenarios=("ecc-errors",),
                ),
            ],
            w=24,
        ),
    ],
    collapsed=False,
)

kernel = Row(
    "Kernel layer",
    [
        timeseries(
            "Evidence: tensor cores idle while SMs busy (kernel/low_tensor_activity)",
            f"SM active (rule: above {pct(TH.tensor_sm_active_min_ratio)}) against tensor active (rule: "
            f"under "
            f"{pct(TH.tensor_active_max_ratio)}).",
            [
                q(
                    f"llmgpu_gpu_sm_active_ratio{{{GPU}}}",
                    "GPU {{gpu}} SM active",
                    scenarios=("healthy", "fp32-fallback"),
                ),
                q(
                    f"llmgpu_gpu_tensor_active_ratio{{{GPU}}}",
                    "GPU {{gpu}} tensor active",
                    scenarios=("healthy", "fp32-fallback"),
                ),
            ],
            unit="percentunit",
            min_=0,
            max_=1,
        ),
        timeseries(
            "Evidence: bandwidth and compute use (kernel/low_mfu_mbu)",
            "Busy GPUs that reach neither 20 % of peak bandwidth (MBU) nor 10 % of peak FLOP/s "
            "(MFU, tensor activity as its proxy) spend their time on launches and syncs.",
            [
                q(f"llmgpu_gpu_dram_active_ratio{{{GPU}}}", "GPU {{gpu}} MBU"),
                q(f"llmgpu_gpu_tensor_active_ratio{{{GPU}}}", "GPU {{gpu}} tensor"),
                q(f"llmgpu_gpu_utilization_ratio{{{GPU}}}", "GPU {{gpu}} utilization"),
            ],
            unit="percentunit",
            min_=0,
            max_=1,
        ),
    ],
)

scheduling = Row(
    "Scheduling layer",
    [
        timeseries(
            "Evidence: queue with idle GPUs (scheduling/queue_with_idle_gpu)",
            f"Waiting requests (rule: at least {TH.queue_waiting_min:g}, not shrinking) against the SM "
            f"activity of the "
            f"engine's GPUs (rule: under {pct(TH.queue_sm_active_max_ratio)}) and its KV-cache usage (rule: "
            f"under "
            f"{pct(TH.queue_kv_usage_max_ratio)}).",
            [
                q(f"llmgpu_engine_requests_waiting{{{ENG}}}", "{{target}} waiting"),
                q(
                    f"avg by (target) (\n{on_engine_gpus('llmgpu_gpu_sm_active_ratio')}\n)",
                    "{{target}} SM active (avg)",
                ),
                q(f"llmgpu_engine_kv_cache_usage_ratio{{{ENG}}}", "{{target}} KV usage"),
            ],
        ),
        timeseries(
            "Evidence: API server CPU (scheduling/api_server_cpu_bound)",
            f"CPU of the engine's API server, one core = 1 (rule: {pct(TH.api_cpu_min_ratio)}).",
            [
                q(
                    f'llmgpu_engine_process_cpu_ratio{{{ENG}, role="api_server"}}',
                    "{{target}}",
                    scenarios=("healthy", "scheduler-bound"),
                )
            ],
            threshold=TH.api_cpu_min_ratio,
        ),
        timeseries(
            "Evidence: admission rejections (scheduling/admission_rejections)",
            f"Requests refused at admission per second (rule: {TH.rejections_min_per_second:g} per second).",
            [
                q(
                    rate("llmgpu_engine_rejected_requests_total", ENG, by="target"),
                    "{{target}}",
                    scenarios=("healthy", "scheduler-bound"),
                )
            ],
            unit="reqps",
            threshold=TH.rejections_min_per_second,
        ),
        timeseries(
            "Evidence: tenants of a shared GPU (scheduling/noisy_neighbour)",
            f"The memory each process holds on its GPU (rule: another owner at "
            f"{pct(TH.neighbour_share_ratio)} or more of the memory in use, or of the SM time, which the "
            f"shared metric profile exports) beside each engine's median inter-token latency (rule: "
            f"{TH.neighbour_slowdown_factor:g} times its best of the last "
            f"{TH.neighbour_baseline_s / 60:g} min).",
            [
                q(f"llmgpu_gpu_process_memory_used_bytes{{{GPU}}}", "GPU {{gpu}} {{process}} ({{pid}})"),
                q(
                    f'llmgpu_engine_inter_token_latency_quantile_seconds{{{ENG}, {Q1M}, quantile="0.5"}}',
                    "{{target}} ITL p50",
                ),
            ],
        ),
        timeseries(
            "Evidence: prefill and decode (scheduling/prefill_starves_decode)",
            "Prefill/decode disaggregation (SGLang): SM activity of each engine's GPUs (rule: prefill at "
            f"{pct(TH.pd_prefill_busy_min_ratio)} or more, decode under {pct(TH.pd_decode_idle_max_ratio)}), "
            f"the prefill queue (rule: at least {TH.pd_prefill_waiting_min:g}) and the requests on their way "
            "to decode (rule: none).",
            [
                q(
                    f"avg by (target) (\n{on_engine_gpus('llmgpu_gpu_sm_active_ratio')}\n)\n"
                    f"and on (target) llmgpu_engine_disagg_queue_requests{{{ENG}}}",
                    "{{target}} SM active (avg)",
                    scenarios=("pd-prefill-bound",),
                ),
                q(
                    f"llmgpu_engine_requests_waiting{{{ENG}}}\n"
                    f'and on (target) llmgpu_engine_disagg_queue_requests{{{ENG}, queue=~"prefill_.*"}}',
                    "{{target}} prefill waiting",
                    scenarios=("pd-prefill-bound",),
                ),
                q(
                    f'sum by (target) (llmgpu_engine_disagg_queue_requests{{{ENG}, queue=~"decode_.*"}})',
                    "{{target}} on its way to decode",
                    scenarios=("pd-prefill-bound",),
                ),
            ],
        ),
    ],
)

parallel = Row(
    "Parallel layer",
    [
        timeseries(
            "Evidence: SM imbalance in a tensor-parallel group (parallel/sm_imbalance)",
            f"Spread of SM activity between the busiest and the idlest GPU of each engine (rule: "
            f"{TH.imbalance_spread_ratio * 100:g} points, with the busiest above "
            f"{pct(TH.imbalance_busiest_min_ratio)}).",
            [
                q(
                    f"max by (target) (\n{on_engine_gpus('llmgpu_gpu_sm_active_ratio')}\n)\n-\n"
                    f"min by (target) (\n{on_engine_gpus('llmgpu_gpu_sm_active_ratio')}\n)",
                    "{{target}} spread",
                    scenarios=("healthy", "nvlink-imbalance"),
                ),
                q(
                    f"max by (target) (\n{on_engine_gpus('llmgpu_gpu_sm_active_ratio')}\n)",
                    "{{target}} busiest",
                ),
            ],
            unit="percentunit",
            min_=0,
            max_=1,
            threshold=TH.imbalance_spread_ratio,
        ),
        timeseries(
            "Evidence: NVLink load (parallel/nvlink_saturated, parallel/tp_over_pcie)",
            f"NVLink bytes sent per second over the capacity of the GPU's links, active or "
            f"asleep ({TH.nvlink_link_bytes_per_second / 1e9:g} GB/s each; rule: "
            f"{pct(TH.nvlink_saturation_ratio)}). A tensor-parallel "
            "engine with no such link runs over PCIe.",
            [
                q(
                    divide(
                        f"llmgpu_gpu_nvlink_tx_bytes_per_second{{{GPU}}}",
                        f"{TH.nvlink_link_bytes_per_second / 1e9:g}e9 * (llmgpu_gpu_nvlink_links_up{{{GPU}}}"
                        f" + llmgpu_gpu_nvlink_links_sleeping{{{GPU}}})",
                    ),
                    "GPU {{gpu}}",
                    scenarios=("healthy", "nvlink-imbalance"),
                ),
            ],
            unit="percentunit",
            min_=0,
            threshold=TH.nvlink_saturation_ratio,
        ),
        timeseries(
            "Evidence: KV transfer and TTFT (parallel/kv_transfer_slow)",
            "Time one request's KV cache takes to move from prefill to decode, and the median time to "
            "first token of the engines (rule: the transfer at "
            f"{pct(TH.kv_transfer_ttft_share_min)} of the model's TTFT or more, with TTFT of "
            f"{TH.kv_transfer_ttft_min_s * 1e3:g} ms or more).",
            [
                q(
                    f"llmgpu_engine_kv_transfer_latency_seconds{{{ENG}}}",
                    "{{target}} KV transfer",
                    scenarios=("pd-kv-transfer-slow",),
                ),
                q(
                    f'llmgpu_engine_time_to_first_token_quantile_seconds{{{ENG}, {Q1M}, quantile="0.5"}}',
                    "{{target}} TTFT p50",
                    scenarios=("pd-kv-transfer-slow",),
                ),
            ],
            unit="s",
        ),
    ],
)

decoding = Row(
    "Decoding layer",
    [
        timeseries(
            "Evidence: speculative-decoding acceptance (decoding/low_spec_acceptance)",
            f"Accepted over proposed draft tokens (rule: under {pct(TH.spec_accept_min_ratio)}).",
            [
                q(
                    f"llmgpu_engine_spec_decode_acceptance_ratio{{{ENG}}}",
                    "{{target}}",
                    scenarios=("spec-decode",),
                )
            ],
            unit="percentunit",
            min_=0,
            max_=1,
            threshold=TH.spec_accept_min_ratio,
        ),
        timeseries(
            "Evidence: inter-token latency jitter (decoding/itl_jitter)",
            f"Inter-token latency p99 over p50 in the last minute (rule: {TH.itl_jitter_factor:g}).",
            [
                q(
                    f'llmgpu_engine_inter_token_latency_quantile_seconds{{{ENG}, {Q1M}, quantile="0.99"}}\n'
                    "/ ignoring (quantile)\n"
                    "(\n"
                    f'  llmgpu_engine_inter_token_latency_quantile_seconds{{{ENG}, {Q1M}, quantile="0.5"}}\n'
                    ") > 0",
                    "{{target}} {{model}}",
                )
            ],
            threshold=TH.itl_jitter_factor,
        ),
    ],
)

capacity = Row(
    "Capacity",
    [
        timeseries(
            "Evidence: SM saturation (capacity/sm_saturation)",
            f"SM active per GPU (rule: above {pct(TH.sm_saturation_ratio)} for "
            f"{TH.sm_saturation_hold_s / 60:g} minutes; the "
            "LlmGpuSmSaturated alert "
            "uses the same level).",
            [
                q(
                    f"llmgpu_gpu_sm_active_ratio{{{GPU}}}",
                    "GPU {{gpu}}",
                    scenarios=("healthy", "sm-saturation"),
                )
            ],
            unit="percentunit",
            min_=0,
            max_=1,
            threshold=TH.sm_saturation_ratio,
        ),
        timeseries(
            "Evidence: throughput knee (capacity/throughput_knee)",
            "Offered requests per second, generated tokens per second and p99 time to first "
            "token: past the knee tokens/s stops rising with load while p99 jumps.",
            [
                q(f"llmgpu_engine_request_rate_per_second{{{ENG}}}", "{{target}} requests/s"),
                q(f"llmgpu_engine_generation_tokens_per_second{{{ENG}}}", "{{target}} tokens/s"),
                q(
                    f'llmgpu_engine_time_to_first_token_quantile_seconds{{{ENG}, {Q1M}, quantile="0.99"}}',
                    "{{target}} TTFT p99",
                ),
            ],
            right_axis={"TTFT": "s", "tokens/s": "short"},
        ),
        timeseries(
            "Evidence: engine restarts (capacity/slow_recovery)",
            f"Whether each engine answers, and how long it was down the last time it crashed or "
            f"restarted (rule: {TH.recovery_target_s:g} s or more, for "
            f"{TH.recovery_window_s / 60:g} minutes after it came back).",
            [
                q(f"llmgpu_engine_up{{{ENG}}}", "{{target}} up"),
                # only a scenario whose engine comes back has a last downtime (engine-restart)
                q(f"llmgpu_engine_last_downtime_seconds{{{ENG}}}", "{{target}} last downtime", scenarios=()),
            ],
            right_axis={"downtime": "s"},
            w=24,
        ),
    ],
)

dashboard = make_dashboard(
    title="LLM GPU / Diagnosis",
    uid="llmgpu-diagnosis",
    description="Bottleneck findings per layer over time, the OOM-risk score, and the series each "
    "diagnosis rule reads, with the rule's threshold drawn in.",
    variables=[cluster_var(), node_var(), custom_var("layer", "Layer", LAYERS), gpu_var()],
    rows=[findings, oom, hardware, kernel, scheduling, parallel, decoding, capacity],
)
