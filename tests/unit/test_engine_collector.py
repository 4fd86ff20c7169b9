"""The engines collector as the exporter sees it: its readings, rendered and linted."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors.base import REGISTRY, Context
from exporter.collectors.engines import EnginesCollector
from exporter.config import Settings
from exporter.engines import discovery
from exporter.engines.readings import EngineGpus, Engines
from exporter.k8s.pods import PodInfo
from exporter.metricdef import metric_defs
from exporter.snapshot import Snapshot
from exporter.web.exposition import render

ROOT = Path(__file__).resolve().parents[2]
PAGES = {
    "vllm": ROOT / "tests/fixtures/vllm/vllm-0.32-cpu-idle.txt",
    "vllm_dp": ROOT / "tests/fixtures/engines/vllm-0.32-dp2-specdecode.txt",
    "sglang": ROOT / "tests/fixtures/engines/sglang-0.5-tp2.txt",
    "tgi": ROOT / "tests/fixtures/engines/tgi-3.0-router.txt",
}

# The names dashboards and alerts are built against (docs/engines.md).
NAMES = {
    "llmgpu_engine_up",
    "llmgpu_engine_max_num_seqs",
    "llmgpu_engine_max_num_batched_tokens",
    "llmgpu_engine_requests_running",
    "llmgpu_engine_requests_waiting",
    "llmgpu_engine_requests_waiting_by_reason",
    "llmgpu_engine_kv_cache_usage_ratio",
    "llmgpu_engine_preemptions_total",
    "llmgpu_engine_prompt_tokens_total",
    "llmgpu_engine_generation_tokens_total",
    "llmgpu_engine_prompt_tokens_cached_total",
    "llmgpu_engine_requests_total",
    "llmgpu_engine_rejected_requests_total",
    "llmgpu_engine_prefix_cache_queries_total",
    "llmgpu_engine_prefix_cache_hits_total",
    "llmgpu_engine_spec_decode_draft_tokens_total",
    "llmgpu_engine_spec_decode_accepted_tokens_total",
    "llmgpu_engine_time_to_first_token_seconds",
    "llmgpu_engine_inter_token_latency_seconds",
    "llmgpu_engine_e2e_request_latency_seconds",
    "llmgpu_engine_queue_time_seconds",
    "llmgpu_engine_prefill_time_seconds",
    "llmgpu_engine_decode_time_seconds",
    "llmgpu_engine_cache_config_info",
    "llmgpu_engine_prompt_tokens_per_second",
    "llmgpu_engine_generation_tokens_per_second",
    "llmgpu_engine_request_rate_per_second",
    "llmgpu_engine_preemptions_per_second",
    "llmgpu_engine_prefix_cache_hit_ratio",
    "llmgpu_engine_spec_decode_acceptance_ratio",
    "llmgpu_engine_time_to_first_token_quantile_seconds",
    "llmgpu_engine_inter_token_latency_quantile_seconds",
    "llmgpu_engine_gpu_info",
    "llmgpu_engine_process_cpu_ratio",
    "llmgpu_engine_scrape_duration_seconds",
    "llmgpu_engine_scrape_errors_total",
    "llmgpu_engine_series",
    "llmgpu_engine_dropped_models",
    "llmgpu_engine_estimated_flops_per_gpu_total",
    "llmgpu_engine_estimated_read_bytes_per_gpu_total",
    "llmgpu_engine_gpu_memory_budget_bytes",
    "llmgpu_engine_disagg_queue_requests",
    "llmgpu_engine_kv_transfer_failures_total",
    "llmgpu_engine_kv_transfer_bytes_total",
    "llmgpu_engine_kv_transfer_seconds",
    "llmgpu_engine_kv_transfer_latency_seconds",
    "llmgpu_engine_kv_transfer_speed_bytes_per_second",
}


def promtool_complaints(text: str) -> list[str]:
    """What `promtool check metrics` says about an exposition, one line per complaint."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed (Debian package prometheus)")
    lint = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    return [ln for ln in (lint.stdout + lint.stderr).splitlines() if ln.strip()]


class PageServer:
    def __init__(self, body: bytes) -> None:
        self.body = body
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = outer.body
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def pages() -> Iterator[dict[str, PageServer]]:
    servers = {k: PageServer(p.read_bytes()) for k, p in PAGES.items()}
    yield servers
    for s in servers.values():
        s.stop()


class Clock:
    t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


def exposition(collector: EnginesCollector) -> str:
    (engines,) = collector.collect().node
    return render(Snapshot(taken_at=0.0, node={Engines: (engines,)})).text.decode()


def test_the_collector_is_registered_and_on_by_default() -> None:
    import exporter.collectors.engines  # noqa: F401 - registers

    reg = REGISTRY["engines"]
    assert reg.default_enabled
    assert isinstance(
        reg.factory(Context(settings=Settings(discover_processes=False), nvml=None)), EnginesCollector
    )


def test_declared_names_are_exactly_the_documented_ones() -> None:
    declared = {m.name for m in metric_defs(Engines)} | {m.name for m in metric_defs(EngineGpus)}
    assert declared == NAMES
    doc = (ROOT / "docs" / "engines.md").read_text()
    assert all(f"`{name}`" in doc for name in NAMES), sorted(n for n in NAMES if f"`{n}`" not in doc)


@pytest.mark.system
def test_all_engine_kinds_render_to_clean_exposition(pages: dict[str, PageServer]) -> None:
    clock = Clock()
    settings = Settings(
        discover_processes=False,
        engines=tuple(f"{'vllm' if k.startswith('vllm') else k}={s.url}" for k, s in pages.items()),
    )
    collector = EnginesCollector(Context(settings=settings, nvml=None, clock=clock))
    collector.refresh()
    # the real server's page before and after its load: quantiles over the window appear
    pages["vllm"].body = (ROOT / "tests/fixtures/vllm/vllm-0.32-cpu-loaded.txt").read_bytes()
    clock.t += 30
    collector.refresh()
    text = exposition(collector)
    fams = {f.name: f for f in text_string_to_metric_families(text)}

    up = {s.labels["target"]: (s.labels["engine"], s.value) for s in fams["llmgpu_engine_up"].samples}
    assert sorted(e for e, _ in up.values()) == ["sglang", "tgi", "vllm", "vllm"]
    assert all(v == 1.0 for _, v in up.values())
    running = fams["llmgpu_engine_requests_running"].samples
    # the DP page gives two series with a dp label; no other page has one
    assert sorted(s.labels.get("dp", "-") for s in running) == ["-", "-", "-", "0", "1"]
    tgi = pages["tgi"].url.split("//")[1].split("/")[0]
    assert [s.labels for s in running if s.labels["target"] == tgi] == [{"engine": "tgi", "target": tgi}]
    info = fams["llmgpu_engine_cache_config_info"].samples
    assert any(s.labels.get("gpu_memory_utilization") == "0.85" and s.labels.get("dp") == "1" for s in info)
    buckets = [
        s
        for s in fams["llmgpu_engine_time_to_first_token_seconds"].samples
        if s.name.endswith("_bucket") and s.labels["engine"] == "sglang"
    ]
    assert [s.labels["le"] for s in buckets][:2] == ["0.1", "0.2"] and buckets[-1].labels["le"] == "+Inf"
    errors = fams["llmgpu_engine_scrape_errors"].samples
    assert errors and all(s.value == 0 for s in errors)
    series = {s.labels["target"]: s.value for s in fams["llmgpu_engine_series"].samples}
    assert min(series.values()) > 20

    quantiles = fams["llmgpu_engine_time_to_first_token_quantile_seconds"].samples
    assert {(q.labels["window"], q.labels["quantile"]) for q in quantiles} == {
        (w, q) for w in ("1m", "5m") for q in ("0.5", "0.95", "0.99")
    }
    assert promtool_complaints(text) == []


def test_kubernetes_discovery_reads_the_opt_in_annotation() -> None:
    def pod(name: str, ip: str | None, notes: dict[str, str]) -> PodInfo:
        return PodInfo(
            namespace="llm",
            name=name,
            uid=f"uid-{name}",
            pod_ip=ip,
            annotations=MappingProxyType(notes),
            containers=(),
        )

    asked: list[str] = []

    def lister(node: str) -> list[PodInfo]:
        asked.append(node)
        return [
            pod(
                "a",
                "10.1.0.5",
                {"example.com/scrape": "true", "example.com/port": "8000", "example.com/engine": "vllm"},
            ),
            pod(
                "b",
                "10.1.0.6",
                {
                    "example.com/scrape": "true",
                    "example.com/path": "stats",
                    "example.com/port": "30000",
                    "example.com/engine": "bogus",
                },
            ),
            pod("c", "10.1.0.7", {"example.com/scrape": "false"}),
            pod("d", None, {"example.com/scrape": "true"}),
        ]

    found = discovery.kubernetes("gpu-node-3", "example.com/scrape", lister)()
    assert asked == ["gpu-node-3"]
    assert [(t.url, t.kind, t.source, t.pod, t.pod_uid) for t in found] == [
        ("http://10.1.0.5:8000/metrics", "vllm", "kubernetes", "a", "uid-a"),
        ("http://10.1.0.6:30000/stats", None, "kubernetes", "b", "uid-b"),
    ]


def test_a_failing_discovery_is_counted_and_keeps_the_targets() -> None:
    def broken() -> list[Any]:
        raise ConnectionError("API server unreachable")

    collector = EnginesCollector(Context(settings=Settings(), nvml=None), discover=[broken])
    collector.refresh()
    assert collector.collect().errors == {"ConnectionError": 1}
    assert collector.collect().errors == {}, "each error is reported once"
