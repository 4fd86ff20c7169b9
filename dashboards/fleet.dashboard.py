"""Fleet: every GPU node at once, built on the recording rules of alerts/."""

from __future__ import annotations

from dashboards.common import (
    CLUSTER,
    Row,
    bargauge,
    cluster_var,
    heatmap,
    q,
    stat,
    table,
    timeseries,
)
from dashboards.common import (
    dashboard as make_dashboard,
)

C = CLUSTER
NOT_SERVING = 'state=~"lost|throttled|saturated"'

overview = Row(
    "Overview",
    [
        stat(
            "Nodes",
            "Exporters that answer their scrapes, and exporter targets that do not.",
            [
                q(f"count(llmgpu_exporter_build_info{{{C}}})", "up"),
                q(f'count(up{{job=~".*llm-gpu-exporter.*", {C}}} == 0) or vector(0)', "down"),
            ],
            w=3,
            text_mode="value_and_name",
        ),
        stat(
            "GPUs",
            "GPUs the exporters report, whatever their state.",
            [q(f"sum(cluster_state:llmgpu_gpus:count{{{C}}})")],
            w=3,
        ),
        stat(
            "GPUs not serving",
            "GPUs lost, throttled or saturated: the ones that cost capacity right now.",
            [q(f"sum(cluster_state:llmgpu_gpus:count{{{C}, {NOT_SERVING}}}) or vector(0)")],
            w=3,
            steps=(("green", None), ("orange", 1), ("red", 4)),
        ),
        stat(
            "Active findings",
            "Diagnosis findings holding now across the fleet, all layers.",
            [q(f"sum(cluster_layer:llmgpu_diagnosis_findings:sum{{{C}}})")],
            w=3,
            steps=(("green", None), ("orange", 1)),
        ),
        stat(
            "Generated tokens/s",
            "Tokens generated per second by every engine in the fleet (5 m rate).",
            [q(f"sum(cluster_model:llmgpu_engine_generation_tokens:rate5m{{{C}}})")],
            w=4,
            graph=True,
        ),
        stat(
            "Fleet power",
            "Power drawn by all GPUs.",
            [q(f"sum(instance:llmgpu_gpu_power_watts:sum{{{C}}})")],
            unit="watt",
            w=4,
            graph=True,
        ),
        stat(
            "OOM-risk nodes",
            "Nodes with a GPU whose diagnosis OOM-risk score is at or above 0.6, the level at "
            "which LlmGpuOomRiskHigh pages.",
            [q(f"count(instance:llmgpu_diagnosis_oom_risk_ratio:max{{{C}}} >= 0.6) or vector(0)")],
            w=4,
            steps=(("green", None), ("red", 1)),
        ),
    ],
)

nodes = Row(
    "Per node",
    [
        table(
            "Node summary",
            "One row per node: average and busiest SM activity, NVML utilization, memory in use, "
            "power, generated tokens/s, findings and the highest OOM-risk score.",
            [
                q(f"instance:llmgpu_gpu_sm_active_ratio:avg{{{C}}}", instant=True, fmt="table"),
                q(f"instance:llmgpu_gpu_sm_active_ratio:max{{{C}}}", instant=True, fmt="table"),
                q(f"instance:llmgpu_gpu_utilization_ratio:avg{{{C}}}", instant=True, fmt="table"),
                q(f"instance:llmgpu_gpu_memory_used:ratio{{{C}}}", instant=True, fmt="table"),
                q(f"instance:llmgpu_gpu_power_watts:sum{{{C}}}", instant=True, fmt="table"),
                q(f"instance:llmgpu_engine_generation_tokens:rate5m{{{C}}}", instant=True, fmt="table"),
                q(
                    f"sum by (cluster, node, instance) (instance_layer:llmgpu_diagnosis_findings:sum{{{C}}})",
                    instant=True,
                    fmt="table",
                ),
                q(f"instance:llmgpu_diagnosis_oom_risk_ratio:max{{{C}}}", instant=True, fmt="table"),
            ],
            w=24,
            h=8,
            rename={
                "node": "Node",
                "instance": "Target",
                "Value #A": "SM active (avg)",
                "Value #B": "SM active (busiest GPU)",
                "Value #C": "Utilization (avg)",
                "Value #D": "Memory used",
                "Value #E": "Power (W)",
                "Value #F": "Generated tokens/s",
                "Value #G": "Findings",
                "Value #H": "OOM-risk score",
            },
        ),
    ],
)

states = Row(
    "GPU states",
    [
        bargauge(
            "GPUs by state",
            "Each GPU in exactly one state, first match wins: lost (NVML stopped answering), "
            "throttled (thermal or power-brake clock events), saturated (SM active above 95 %), "
            "idle (no kernel in 95 % of the period), serving.",
            [q(f"sum by (state) (cluster_state:llmgpu_gpus:count{{{C}}})", "{{state}}", instant=True)],
            w=8,
            steps=(("blue", None),),
        ),
        timeseries(
            "GPUs by state over time",
            "The same states over time; a band that grows is capacity leaving the fleet.",
            [q(f"sum by (state) (cluster_state:llmgpu_gpus:count{{{C}}})", "{{state}}")],
            stack=True,
            w=8,
        ),
        table(
            "Nodes with GPUs not serving",
            "Per node, the GPUs that are lost, throttled or saturated.",
            [
                q(
                    f"sum by (cluster, node, instance, state) (\n"
                    f"  instance_state:llmgpu_gpus:count{{{C}, {NOT_SERVING}}}\n)",
                    instant=True,
                    fmt="table",
                    scenarios=("sm-saturation", "thermal-throttle", "gpu-lost"),
                )
            ],
            w=8,
            rename={"node": "Node", "instance": "Target", "state": "State", "Value": "GPUs"},
        ),
    ],
)

heat = Row(
    "Heat maps across nodes",
    [
        heatmap(
            "SM active by node",
            "Average fraction of SMs busy on each node's GPUs (GPM). A saturated node glows; an "
            "idle one goes dark while its neighbours work.",
            q(f"instance:llmgpu_gpu_sm_active_ratio:avg{{{C}}}", "{{instance}}"),
        ),
        heatmap(
            "DRAM bandwidth by node",
            "Average DRAM bandwidth used over the datasheet peak (GPM) on each node. Near 1 the "
            "node is memory-bandwidth bound, the normal state of decode.",
            q(f"instance:llmgpu_gpu_dram_active_ratio:avg{{{C}}}", "{{instance}}"),
        ),
        heatmap(
            "Memory used by node",
            "Framebuffer memory in use over the total, per node. An engine holds its own budget "
            "(gpu_memory_utilization, 0.9 by default); above it something else is growing.",
            q(f"instance:llmgpu_gpu_memory_used:ratio{{{C}}}", "{{instance}}"),
        ),
    ],
)

risk = Row(
    "Findings and risk",
    [
        timeseries(
            "Active findings by layer",
            "Diagnosis findings holding, summed over the fleet per layer (hardware, kernel, memory, "
            "scheduling, parallel, decoding, capacity).",
            [q(f"sum by (layer) (cluster_layer:llmgpu_diagnosis_findings:sum{{{C}}})", "{{layer}}")],
            stack=True,
            w=12,
        ),
        table(
            "Findings by node and layer",
            "Nodes with at least one finding now, per layer. Open the Diagnosis dashboard on a node "
            "for the rules and their evidence.",
            [
                q(
                    f"instance_layer:llmgpu_diagnosis_findings:sum{{{C}}} > 0",
                    instant=True,
                    fmt="table",
                    scenarios=(
                        "sm-saturation",
                        "kv-pressure",
                        "thermal-throttle",
                        "memory-leak",
                        "gpu-lost",
                        "ecc-errors",
                    ),
                )
            ],
            w=12,
            rename={"node": "Node", "instance": "Target", "layer": "Layer", "Value": "Findings"},
        ),
        table(
            "Nodes at OOM risk",
            "Nodes whose highest diagnosis OOM-risk score is at or above 0.6 (the finding and alert "
            "level), and, independent of the diagnosis, nodes whose fullest GPU has under 5 % of "
            "its memory free.",
            [
                q(
                    f"sort_desc(instance:llmgpu_diagnosis_oom_risk_ratio:max{{{C}}} >= 0.6)",
                    instant=True,
                    fmt="table",
                    scenarios=("memory-leak", "oom-crash"),
                ),
                q(
                    f"instance:llmgpu_gpu_memory_free:min_ratio{{{C}}} < 0.05",
                    instant=True,
                    fmt="table",
                    scenarios=("memory-leak", "oom-crash"),
                ),
            ],
            w=12,
            unit="percentunit",
            rename={
                "node": "Node",
                "instance": "Target",
                "Value #A": "OOM-risk score",
                "Value #B": "Free memory (fullest GPU)",
            },
        ),
        timeseries(
            "OOM-risk score by node",
            "Highest diagnosis OOM-risk score of each node's GPUs, 0-1. The dashed line is the "
            "finding and alert level.",
            [q(f"instance:llmgpu_diagnosis_oom_risk_ratio:max{{{C}}}", "{{instance}}")],
            unit="percentunit",
            max_=1,
            min_=0,
            threshold=0.6,
            w=12,
        ),
    ],
)

throughput = Row(
    "Serving",
    [
        timeseries(
            "Generated tokens/s per model",
            "Tokens generated per second, summed over every engine serving the model (5 m rate).",
            [q(f"cluster_model:llmgpu_engine_generation_tokens:rate5m{{{C}}}", "{{model}}")],
            w=8,
        ),
        timeseries(
            "Prompt tokens/s per model",
            "Prompt (prefill) tokens processed per second, per model (5 m rate).",
            [q(f"cluster_model:llmgpu_engine_prompt_tokens:rate5m{{{C}}}", "{{model}}")],
            w=8,
        ),
        timeseries(
            "Finished requests/s per model",
            "Requests finished per second, any finish reason, per model (5 m rate).",
            [q(f"cluster_model:llmgpu_engine_requests:rate5m{{{C}}}", "{{model}}")],
            unit="reqps",
            w=8,
        ),
        timeseries(
            "KV-cache usage by node",
            "Fullest KV cache of the engines on each node. Near 1 with preemptions is the "
            "LlmGpuKvCacheSaturated alert.",
            [q(f"instance:llmgpu_engine_kv_cache_usage_ratio:max{{{C}}}", "{{instance}}")],
            unit="percentunit",
            max_=1,
            min_=0,
            w=8,
        ),
        timeseries(
            "Preemptions/s by node",
            "Requests preempted per second by the engines on each node (5 m rate).",
            [q(f"instance:llmgpu_engine_preemptions:rate5m{{{C}}}", "{{instance}}")],
            w=8,
        ),
        timeseries(
            "Hottest GPU by node",
            "Highest GPU die temperature on each node.",
            [q(f"instance:llmgpu_gpu_temperature_celsius:max{{{C}}}", "{{instance}}")],
            unit="celsius",
            w=8,
        ),
    ],
)

dashboard = make_dashboard(
    title="LLM GPU / Fleet",
    uid="llmgpu-fleet",
    description="Every GPU node serving LLMs: GPU states, load heat maps, findings, OOM risk and throughput.",
    variables=[cluster_var()],
    rows=[overview, nodes, states, heat, risk, throughput],
)
