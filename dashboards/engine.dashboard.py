"""Engine: what the inference engines report, joined with the GPUs they run on."""

from __future__ import annotations

from dashboards.common import (
    NODE,
    ON_GPU,
    Row,
    cluster_var,
    divide,
    model_var,
    node_var,
    q,
    quantile,
    query_var,
    rate,
    stat,
    table,
    target_var,
    timeseries,
)
from dashboards.common import (
    dashboard as make_dashboard,
)

E = f'{NODE}, namespace=~"$namespace", model=~"$model", target=~"$target"'
TTFT = "llmgpu_engine_time_to_first_token_seconds"
ITL = "llmgpu_engine_inter_token_latency_seconds"
E2E = "llmgpu_engine_e2e_request_latency_seconds"
QUEUE = "llmgpu_engine_queue_time_seconds"
T = f'{NODE}, target=~"$target"'
Q1M = 'window="1m", quantile=~"0.5|0.99"'


def quantiles(metric: str) -> list:
    return [q(quantile(phi, metric, E), f"{{{{model}}}} p{round(phi * 100)}") for phi in (0.5, 0.9, 0.99)]


def on_engine_gpus(metric: str) -> str:
    """A GPU metric for each GPU an engine runs on, labelled with the engine's target and model."""
    return f"llmgpu_engine_gpu_info{{{E}}}\n* {ON_GPU} group_left ()\n{metric}"


overview = Row(
    "Overview",
    [
        stat(
            "Engines up",
            "Engine targets whose last scrape succeeded, and those whose last scrape failed.",
            [
                q(f"count(llmgpu_engine_up{{{E}}} == 1) or vector(0)", "up"),
                q(f"count(llmgpu_engine_up{{{E}}} == 0) or vector(0)", "down"),
            ],
            text_mode="value_and_name",
            w=4,
        ),
        stat(
            "Generated tokens/s",
            "Tokens generated per second by the selected engines.",
            [q(f"sum({rate('llmgpu_engine_generation_tokens_total', E)})")],
            graph=True,
            w=4,
        ),
        stat(
            "TTFT p99",
            "99th percentile time to first token over the selected engines. Interactive target: 200 ms.",
            [q(f"histogram_quantile(0.99, sum by (le) (rate({TTFT}_bucket{{{E}}}[$__rate_interval])))")],
            unit="s",
            steps=(("green", None), ("red", 0.2)),
            graph=True,
            w=4,
        ),
        stat(
            "Requests running / waiting",
            "Requests in the running batch and in the queue, now.",
            [
                q(f"sum(llmgpu_engine_requests_running{{{E}}})", "running"),
                q(f"sum(llmgpu_engine_requests_waiting{{{E}}})", "waiting"),
            ],
            text_mode="value_and_name",
            w=4,
        ),
        stat(
            "Fullest KV cache",
            "Fullest KV cache among the selected engines.",
            [q(f"max(llmgpu_engine_kv_cache_usage_ratio{{{E}}})")],
            unit="percentunit",
            steps=(("green", None), ("orange", 0.9), ("red", 0.95)),
            graph=True,
            w=4,
        ),
        stat(
            "Error ratio",
            "Share of finished requests that ended in an error over the last 5 minutes. Alert level: 0.1 %.",
            [
                q(
                    divide(
                        f'sum(rate(llmgpu_engine_requests_total{{{E}, finish_reason="error"}}[5m]))',
                        f"sum(rate(llmgpu_engine_requests_total{{{E}}}[5m]))",
                    )
                )
            ],
            unit="percentunit",
            steps=(("green", None), ("red", 0.001)),
            decimals=3,
            w=4,
        ),
    ],
)

latency = Row(
    "Latency",
    [
        timeseries(
            "Time to first token",
            "p50, p90 and p99 time to first token per model, from the engine's histogram. The "
            "dashed line is the 200 ms interactive target.",
            quantiles(TTFT),
            unit="s",
            threshold=0.2,
        ),
        timeseries(
            "Inter-token latency",
            "p50, p90 and p99 time between two generated tokens of a request. p99 far above p50 "
            "is stuttering streams (preemption, prefill interleaving, host stalls).",
            quantiles(ITL),
            unit="s",
        ),
        timeseries(
            "End-to-end request latency",
            "p50, p90 and p99 time from arrival to the last token.",
            quantiles(E2E),
            unit="s",
        ),
        timeseries(
            "Queue time",
            "p50, p90 and p99 time requests waited before their first scheduling.",
            quantiles(QUEUE),
            unit="s",
        ),
        timeseries(
            "Prefill and decode time",
            "Median time requests spent in prefill and in decode.",
            [
                q(quantile(0.5, "llmgpu_engine_prefill_time_seconds", E), "{{model}} prefill p50"),
                q(quantile(0.5, "llmgpu_engine_decode_time_seconds", E), "{{model}} decode p50"),
            ],
            unit="s",
        ),
        timeseries(
            "TTFT and ITL quantiles (exporter, 1 m window)",
            "The quantiles the exporter interpolates itself over the last minute; the same the "
            "diagnosis and the HTML page use.",
            [
                q(
                    f"llmgpu_engine_time_to_first_token_quantile_seconds{{{E}, {Q1M}}}",
                    "{{model}} TTFT q{{quantile}}",
                ),
                q(
                    f"llmgpu_engine_inter_token_latency_quantile_seconds{{{E}, {Q1M}}}",
                    "{{model}} ITL q{{quantile}}",
                ),
            ],
            unit="s",
        ),
        timeseries(
            "TTFT SLO: share over 200 ms and burn rate",
            "Share of requests whose first token came later than 200 ms (5 m and 1 h), from the "
            "recording rules; the objective allows 5 %. A 1 h share above 72 % (14.4 times the "
            "budget) together with the 5 m share pages (LlmGpuTtftSloBurnFast).",
            [
                q(f"target_model:llmgpu_engine_ttft_over_slo:ratio_rate5m{{{E}}}", "{{model}} {{target}} 5m"),
                q(f"target_model:llmgpu_engine_ttft_over_slo:ratio_rate1h{{{E}}}", "{{model}} {{target}} 1h"),
            ],
            unit="percentunit",
            min_=0,
            threshold=0.72,
            w=24,
        ),
    ],
)

throughput = Row(
    "Throughput and load",
    [
        timeseries(
            "Tokens/s",
            "Prompt (prefill) and generated tokens per second per model, from the counters, and "
            "the generation rate the exporter derives over the last minute.",
            [
                q(rate("llmgpu_engine_prompt_tokens_total", E, by="model"), "{{model}} prompt"),
                q(rate("llmgpu_engine_generation_tokens_total", E, by="model"), "{{model}} generated"),
                q(
                    f"sum by (model) (llmgpu_engine_generation_tokens_per_second{{{E}}})",
                    "{{model}} generated (1 m)",
                ),
            ],
        ),
        timeseries(
            "Requests/s by finish reason",
            "Finished requests per second by finish reason (stop, length, abort, error), and "
            "requests refused at admission.",
            [
                q(
                    rate("llmgpu_engine_requests_total", E, by="model, finish_reason"),
                    "{{model}} {{finish_reason}}",
                ),
                q(rate("llmgpu_engine_rejected_requests_total", E, by="model"), "{{model}} rejected"),
            ],
            unit="reqps",
        ),
        timeseries(
            "Running and waiting",
            "Requests in the running batch and in the queue, and why they wait.",
            [
                q(f"sum by (model) (llmgpu_engine_requests_running{{{E}}})", "{{model}} running"),
                q(f"sum by (model) (llmgpu_engine_requests_waiting{{{E}}})", "{{model}} waiting"),
                q(
                    f"sum by (model, reason) (llmgpu_engine_requests_waiting_by_reason{{{E}}}) > 0",
                    "{{model}} waiting: {{reason}}",
                    scenarios=("kv-pressure", "scheduler-bound"),
                ),
            ],
        ),
        timeseries(
            "Offered load",
            "Requests per second offered to each engine (finished + rejected + queue growth), "
            "as the exporter derives it.",
            [
                q(
                    f"sum by (model, target) (llmgpu_engine_request_rate_per_second{{{E}}})",
                    "{{model}} {{target}}",
                )
            ],
            unit="reqps",
        ),
    ],
)

cache = Row(
    "KV cache, prefix cache, speculative decoding",
    [
        timeseries(
            "KV-cache usage",
            "Fraction of KV-cache blocks in use. Above 95 % with preemptions the engine evicts "
            "running sequences and recomputes them later.",
            [q(f"llmgpu_engine_kv_cache_usage_ratio{{{E}}}", "{{model}} {{target}}")],
            unit="percentunit",
            min_=0,
            max_=1,
            threshold=0.95,
        ),
        timeseries(
            "Preemptions/s",
            "Requests preempted per second to free KV cache.",
            [q(rate("llmgpu_engine_preemptions_total", E, by="model, target"), "{{model}} {{target}}")],
        ),
        timeseries(
            "Prefix-cache hit ratio",
            "Prompt tokens found in the prefix cache over those looked up, and the share of "
            "prompt tokens served from it.",
            [
                q(
                    divide(
                        rate("llmgpu_engine_prefix_cache_hits_total", E, by="model"),
                        rate("llmgpu_engine_prefix_cache_queries_total", E, by="model"),
                    ),
                    "{{model}} hits / queries",
                ),
                q(f"llmgpu_engine_prefix_cache_hit_ratio{{{E}}}", "{{model}} {{target}} (1 m)"),
                q(
                    divide(
                        rate("llmgpu_engine_prompt_tokens_cached_total", E, by="model"),
                        rate("llmgpu_engine_prompt_tokens_total", E, by="model"),
                    ),
                    "{{model}} cached prompt share",
                ),
            ],
            unit="percentunit",
            min_=0,
            max_=1,
        ),
        timeseries(
            "Speculative-decoding acceptance",
            "Draft tokens accepted over those proposed. Below 50 % speculation usually costs "
            "more than it saves.",
            [
                q(
                    divide(
                        rate("llmgpu_engine_spec_decode_accepted_tokens_total", E, by="model"),
                        rate("llmgpu_engine_spec_decode_draft_tokens_total", E, by="model"),
                    ),
                    "{{model}}",
                    scenarios=("spec-decode",),
                ),
                q(
                    f"llmgpu_engine_spec_decode_acceptance_ratio{{{E}}}",
                    "{{model}} {{target}} (1 m)",
                    scenarios=("spec-decode",),
                ),
            ],
            unit="percentunit",
            min_=0,
            max_=1,
            threshold=0.5,
        ),
    ],
)

gpus = Row(
    "The GPUs it runs on",
    [
        timeseries(
            "SM and tensor activity of the engine's GPUs",
            "SM active and tensor active of every GPU the engine's processes run on, joined "
            "through llmgpu_engine_gpu_info. In one tensor-parallel group they should move "
            "together; one lagging GPU is a straggler.",
            [
                q(on_engine_gpus("llmgpu_gpu_sm_active_ratio"), "{{model}} GPU {{gpu}} SM"),
                q(on_engine_gpus("llmgpu_gpu_tensor_active_ratio"), "{{model}} GPU {{gpu}} tensor"),
            ],
            unit="percentunit",
            min_=0,
            max_=1,
        ),
        timeseries(
            "DRAM bandwidth of the engine's GPUs",
            "DRAM bandwidth over peak of the engine's GPUs: decode is bound by it.",
            [q(on_engine_gpus("llmgpu_gpu_dram_active_ratio"), "{{model}} GPU {{gpu}}")],
            unit="percentunit",
            min_=0,
            max_=1,
        ),
        timeseries(
            "Memory of the engine's GPUs",
            "Memory used on the engine's GPUs against their total.",
            [
                q(on_engine_gpus("llmgpu_gpu_memory_used_bytes"), "{{model}} GPU {{gpu}} used"),
                q(on_engine_gpus("llmgpu_gpu_memory_total_bytes"), "{{model}} GPU {{gpu}} total"),
            ],
            unit="bytes",
        ),
        timeseries(
            "Power of the engine's GPUs",
            "Power drawn by the engine's GPUs.",
            [
                q(on_engine_gpus("llmgpu_gpu_power_watts"), "{{model}} GPU {{gpu}}"),
            ],
            unit="watt",
        ),
        timeseries(
            "Tokens per joule",
            "Generated tokens per second over the power of the engine's GPUs: the energy cost of serving.",
            [
                q(
                    divide(
                        rate("llmgpu_engine_generation_tokens_total", E, by="model"),
                        "sum by (model) (\n" + on_engine_gpus("llmgpu_gpu_power_watts") + "\n)",
                    ),
                    "{{model}}",
                )
            ],
        ),
        timeseries(
            "Energy per generated token",
            "Joules the engine's GPUs used per generated token over the last minute, as the "
            "diagnosis computes it from the GPUs' energy counters and the engine's token counter. "
            "Absent where the GPUs are shared with another engine or split with MIG.",
            # the lab plays faster than its engines are scraped: no minute holds two scrapes
            [q(f"llmgpu_engine_energy_per_token_joules{{{T}}}", "{{target}}", scenarios=())],
            unit="joule",
            min_=0,
        ),
        timeseries(
            "Cost per million tokens",
            "What a million generated tokens cost at the configured price per GPU-hour "
            "(gpu_hour_price, in its currency): the engine's GPUs times the time it took them. "
            "Absent until a price is configured.",
            # no scenario of the lab configures a price, so none is expected to draw it
            [q(f"llmgpu_engine_cost_per_million_tokens{{{T}}}", "{{target}}", scenarios=())],
            min_=0,
        ),
        timeseries(
            "Engine process CPU",
            "CPU use of the engine's processes by role, one full core = 1. A Python API server "
            "near 1 is bound by the GIL.",
            [q(f'llmgpu_engine_process_cpu_ratio{{{NODE}, target=~"$target"}}', "{{target}} {{role}}")],
            threshold=0.9,
        ),
        table(
            "GPUs of each engine",
            "The join table: engine target and model to GPU index and UUID.",
            [q(f"llmgpu_engine_gpu_info{{{E}}}", instant=True, fmt="table")],
            hide=("Time", "__name__", "job", "cluster", "Value"),
            w=24,
        ),
    ],
)

scrape = Row(
    "Engine scrapes",
    [
        timeseries(
            "Engine up",
            "1 when the exporter's last scrape of the engine succeeded.",
            [q(f"llmgpu_engine_up{{{E}}}", "{{target}} {{model}}")],
            min_=0,
            max_=1,
            w=8,
        ),
        timeseries(
            "Last downtime",
            "How long each engine was down the last time it crashed or restarted, from its first "
            "failed scrape to its first good one after it. A restart should take under 10 s "
            "(capacity/slow_recovery).",
            # only a scenario whose engine comes back has one (engine-restart, not in the lab)
            [q(f"llmgpu_engine_last_downtime_seconds{{{T}}}", "{{target}}", scenarios=())],
            unit="s",
            threshold=10,
            w=24,
        ),
        timeseries(
            "Scrape duration and size",
            "Wall time of the last scrape of each engine, and samples on its page (right axis).",
            [
                q(
                    f'llmgpu_engine_scrape_duration_seconds{{{NODE}, target=~"$target"}}',
                    "{{target}} duration",
                ),
                q(f'llmgpu_engine_series{{{NODE}, target=~"$target"}}', "{{target}} samples"),
            ],
            unit="s",
            right_axis={"samples": "short"},
            w=8,
        ),
        timeseries(
            "Scrape errors",
            "Failed scrapes per second by reason (refused, timeout, http_status, not_prometheus, "
            "too_large, too_many_series, unknown_engine, connection).",
            [
                q(
                    "sum by (target, reason) (\n"
                    f"  rate(llmgpu_engine_scrape_errors_total{{{T}}}[$__rate_interval])\n)",
                    "{{target}} {{reason}}",
                ),
            ],
            w=8,
        ),
    ],
)

dashboard = make_dashboard(
    title="LLM GPU / Engine",
    uid="llmgpu-engine",
    description="Inference engines (vLLM, SGLang, TGI): latency quantiles, throughput, queue, KV cache, "
    "prefix cache, speculative decoding, and the GPUs each engine runs on.",
    variables=[
        cluster_var(),
        node_var(),
        query_var(
            "namespace",
            "Namespace",
            'label_values(llmgpu_engine_up{cluster=~"$cluster", instance=~"$node"}, namespace)',
        ),
        model_var(),
        target_var(),
    ],
    rows=[overview, latency, throughput, cache, gpus, scrape],
)
