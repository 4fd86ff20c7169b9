"""docs/metrics.md: the metric catalog as a table, with what each GPU supports."""

from __future__ import annotations

import re

from exporter import catalog

# Which GPUs provide each family; everything else works on every NVIDIA data-center GPU.
SUPPORT = {
    "gpm": "Hopper and later through NVML GPM; Volta and later data-center parts (A100, A10, L4, "
    "L40S) through a co-located dcgm-exporter; absent elsewhere",
    "sources": "where the profiling family is present",
    "nvlink": "GPUs with NVLink (SXM A100/H100/H200, B200)",
    "mig": "A100, A30, H100, H200, B200 (MIG-capable)",
    "gpm_mig": "Hopper and later in MIG mode, driver R525 on, GPU instances with a compute instance",
    "ecc": "GPUs with ECC memory",
}
# Metrics whose support is narrower than their family's.
METRIC_SUPPORT = {
    "llmgpu_gpu_memory_temperature_celsius": "HBM parts only (A100, H100, H200, B200)",
    "llmgpu_gpu_clock_event_seconds_total": "SW power cap and SW thermal: all; HW thermal and HW power "
    "brake: drivers whose numbering is known (R575 to 580.65, 580.82 on)",
    "llmgpu_gpu_remapped_rows": "ECC parts from A100 on (row remapping)",
    "llmgpu_gpu_row_remap_pending": "ECC parts from A100 on (row remapping)",
    "llmgpu_gpu_row_remap_failed": "ECC parts from A100 on (row remapping)",
}


def _unit(name: str) -> str:
    for suffix in ("bytes_per_second", "bytes", "seconds", "watts", "joules", "hertz", "celsius", "ratio"):
        if re.search(rf"_{suffix}(_total)?$", name):
            return suffix.replace("_per_", "/")
    return "info" if name.endswith("_info") else "count"


def _source(help_text: str) -> str:
    match = re.search(r"\(([^()]*)\)\s*$", help_text)
    return match.group(1) if match else "exporter"


def markdown() -> str:
    lines = [
        "# Metric catalog",
        "",
        "Every series the exporter can expose, generated from the declarations in the code",
        "(`make docs`; a test keeps it current).",
        "A metric a GPU or engine cannot provide is absent, never zero;",
        "`llmgpu_gpu_metric_supported{family}` says which families each GPU provides.",
        "GPU series also carry `namespace`, `pod` and `container` when pod attribution is on",
        "(and `claim` for a GPU allocated through DRA); series listing `namespace`, `pod` and",
        "`container` carry their process' or container's own, and the pod labels the",
        "`pod_labels` allow-list copies (docs/kubernetes.md).",
        "",
        "Profile: `default` families are exposed unless switched off (`metric_profile: default`,",
        "the setting's default); `shared` families with `metric_profile: shared` or `full`;",
        "`full` families only with `metric_profile: full`; either when named",
        "in `metrics_enabled` (`--metric NAME`). `metrics_disabled` (`--no-metric NAME`) leaves",
        "any family out. The diagnosis reads every reading whatever the profile.",
        "",
        "| name | type | labels | unit | source | GPUs | profile |",
        "|---|---|---|---|---|---|---|",
    ]
    for metric, labels, family in catalog.rows():
        help_text = metric.help.replace("|", "/")
        description = re.sub(r"\s*\([^()]*\)\s*$", "", help_text)
        support = ""
        if metric.name.startswith("llmgpu_gpu_"):
            support = METRIC_SUPPORT.get(metric.name) or SUPPORT.get(family, "all")
        label_list = ", ".join(f"`{x}`" for x in labels)
        lines.append(
            f"| `{metric.name}` | {metric.kind} | {label_list} | {_unit(metric.name)} "
            f"| {_source(help_text)} — {description} | {support} | {metric.profile} |"
        )
    return "\n".join(lines) + "\n"
