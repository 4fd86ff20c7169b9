"""What the benchmark runs and against what: the exporters, request kinds, targets and plans."""

from __future__ import annotations

from dataclasses import dataclass

OURS, REF = "llm-gpu-exporter", "nvitop-exporter"
SCRAPERS = 10
# What Prometheus 2.x sends by default (scrape.go, scrapeAcceptHeader); its HTTP client
# also asks for gzip.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
MODES: dict[str, dict[str, str]] = {
    "plain": {"accept-encoding": "identity"},
    "gzip": {"accept-encoding": "gzip"},
    "prometheus": {"accept": PROMETHEUS_ACCEPT, "accept-encoding": "gzip"},
}
TARGETS = {
    "p99_ms": {8: 2.0, 72: 10.0},
    "sampling_ms_per_gpu": 1.0,
    "process_core_ratio_8": 0.01,
    "rss_mb": 80.0,
}


@dataclass(frozen=True)
class Plan:
    sequential: int  # requests per mode, one client
    concurrent_each: int  # requests per scraper, SCRAPERS of them
    phase_s: float  # wall cap of one latency phase, all rounds together
    cpu_window_s: float
    sampling_s: float  # wall budget of the measured sampling passes
    nvitop_cycles: int
    spaced: int  # Prometheus requests one publish cycle apart, all rounds together
    rounds: int  # the latency phases are split into this many interleaved rounds
    history_s: float  # wall budget for filling the diagnosis history in-process


FULL = Plan(
    sequential=240,
    concurrent_each=24,
    phase_s=10.0,
    cpu_window_s=15.0,
    sampling_s=6.0,
    nvitop_cycles=30,
    spaced=16,
    rounds=4,
    history_s=60.0,
)
QUICK = Plan(
    sequential=40,
    concurrent_each=5,
    phase_s=4.0,
    cpu_window_s=5.0,
    sampling_s=2.0,
    nvitop_cycles=8,
    spaced=2,
    rounds=2,
    history_s=5.0,
)
SPACED_GAP_S = 1.1  # longer than the 1 s publish interval: every scrape meets a fresh cycle
SETTLE_S = 1.5
