"""Self-metrics of the dcgm-exporter source: one reading per dcgm-exporter target.

Fields without metric metadata travel with the reading for the diagnosis (which GPUs
the page lists, which profiling fields it carries) and are never exported.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.metricdef import counter, gauge, label, nested

# Reasons a scrape can fail: the engine targets' (exporter.engines.readings) but
# `unknown_engine`. A valid page without profiling samples is no failure: its GPUs count
# as no_profiling in llmgpu_dcgm_exporter_gpus.
DCGM_SCRAPE_ERRORS = (
    "dns",
    "refused",
    "timeout",
    "http_status",
    "not_prometheus",
    "too_large",
    "too_many_series",
    "too_many_labels",  # the same caps as engine pages: nothing over them is re-exported
    "label_too_long",
    "bad_encoding",
    "connection",
)


@dataclass(frozen=True, kw_only=True)
class DcgmExporterTarget:
    target: str = label()  # the URL scraped
    source: str = label()  # configured, kubernetes, local or simulated
    up: int | None = gauge(
        "llmgpu_dcgm_exporter_up",
        "1 when the last scrape of the dcgm-exporter returned a page",
    )
    scrape_duration_seconds: float | None = gauge(
        "llmgpu_dcgm_exporter_scrape_duration_seconds", "Wall time of the last dcgm-exporter scrape"
    )
    scrape_errors: dict[str, int] | None = counter(
        "llmgpu_dcgm_exporter_scrape_errors_total",
        "Failed dcgm-exporter scrapes by reason (every reason present from 0)",
        label="reason",
    )
    sample_age_seconds: float | None = gauge(
        "llmgpu_dcgm_exporter_sample_age_seconds",
        "Seconds since the last good dcgm-exporter page; past dcgm_exporter_max_age its values are dropped",
    )
    gpus: dict[str, int] | None = gauge(
        "llmgpu_dcgm_exporter_gpus",
        "Whole GPUs on the last good page by state: fresh (used), stale (values frozen or "
        "timestamped past dcgm_exporter_max_age, dropped), no_profiling (listed without a profiling value)",
        label="state",
    )
    mig_samples: int | None = gauge(
        "llmgpu_dcgm_exporter_mig_samples",
        "Profiling samples of MIG instances (GPU_I_ID) on the last good page; not mapped to whole GPUs",
    )
    # for the diagnosis, not exported
    listed: frozenset[str] = frozenset()
    fresh: frozenset[str] = frozenset()
    stale: frozenset[str] = frozenset()
    fields: frozenset[str] = frozenset()
    last_error: str | None = None


@dataclass(frozen=True)
class DcgmExporters:
    """Every dcgm-exporter target of this node: a node reading."""

    targets: tuple[DcgmExporterTarget, ...] = nested(DcgmExporterTarget)
