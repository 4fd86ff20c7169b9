"""A dead, slow, stale or garbage dcgm-exporter never delays or breaks GPU sampling.

The collector reads the simulated dcgm-exporter over HTTP through the production path
(fake NVML, runner, bounded fetch); every fault shows up in the llmgpu_dcgm_exporter_*
self-metrics, and an old value is dropped, not used forever.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from exporter.collectors.base import Context
from exporter.collectors.dcgm import DcgmCollector, resolve
from exporter.config import ConfigError, Settings
from exporter.dcgm.location import LOCAL_URL, DcgmTarget
from exporter.dcgm.status import DcgmExporters, DcgmExporterTarget
from exporter.gpu_readings import MetricSources, Power, Profiling
from exporter.snapshot import Snapshot

FAULTS = """
name: dcgm-faults
gpus: {count: 2, model: A100-80GB-SXM}
dcgm_exporter:
  interval: 10
  faults:
    - {kind: down, at: 100, until: 250}
    - {kind: refused, at: 300, until: 310}
    - {kind: garbage, at: 400, until: 410}
    - {kind: huge, at: 500, until: 510, bytes: 4194304}
    - {kind: slow, at: 600, until: 610, seconds: 2}
    - {kind: stale, at: 700, until: 900}
    - {kind: foreign, at: 1000, until: 1010}
phases:
  - name: busy
    duration: 1100
    gpu: {util: 0.9, sm_active: 0.55, tensor_active: 0.4, dram_active: 0.7, power_ratio: 0.6}
"""


def target(snap: Snapshot) -> DcgmExporterTarget:
    r = snap.get(DcgmExporters)
    assert r is not None and len(r.targets) == 1
    return r.targets[0]


def prof(snap: Snapshot, gpu: int = 0) -> Profiling | None:
    g = snap.gpu(gpu)
    assert g is not None and g.get(Power) is not None, "NVML sampling goes on whatever the dcgm-exporter does"
    return g.get(Profiling)


def status_errors(snap: Snapshot) -> dict[str, int]:
    s = next(c for c in snap.collectors if c.collector == "dcgm")
    return dict(s.errors or {})


@pytest.fixture
def faults(sim):  # type: ignore[no-untyped-def]
    return sim(
        FAULTS,
        engine_timeout=0.5,
        engine_max_bytes=1024 * 1024,
        metrics_enabled=("llmgpu_gpu_metric_source",),  # full-profile family, switched on
    )


def test_no_profiling_sample_before_dcgms_first_window(faults) -> None:  # type: ignore[no-untyped-def]
    snap = faults.at(5)
    assert prof(snap) is None and target(snap).up == 1
    assert target(snap).gpus == {"fresh": 0, "stale": 0, "no_profiling": 2}
    snap = faults.at(20)
    p = prof(snap)
    assert p is not None and p.sm_active_ratio == pytest.approx(0.55, abs=1e-5)
    assert p.dram_active_ratio == pytest.approx(0.7, abs=1e-5)
    assert target(snap).gpus == {"fresh": 2, "stale": 0, "no_profiling": 0}
    ms = snap.gpu(0).get(MetricSources)  # type: ignore[union-attr]
    assert ms is not None and {i.source for i in ms.items} == {"dcgm"}


def test_a_dead_dcgm_exporter_is_remembered_only_max_age(faults) -> None:  # type: ignore[no-untyped-def]
    faults.at(95)
    snap = faults.at(100)
    t = target(snap)
    assert t.up == 0 and t.scrape_errors is not None and t.scrape_errors["http_status"] == 1
    assert "HTTP 500" in (t.last_error or "")
    assert prof(snap) is not None, "5 s after the last good page its values still hold"
    assert status_errors(snap) == {"http_status": 1}
    snap = faults.at(186)  # 91 s after the last good page
    assert prof(snap) is None and target(snap).sample_age_seconds == pytest.approx(91, abs=0.01)
    snap = faults.at(260)
    assert prof(snap) is not None and target(snap).up == 1


@pytest.mark.parametrize(
    ("at", "reason"),
    [(305, "connection"), (405, "not_prometheus"), (505, "too_large"), (605, "timeout")],
)
@pytest.mark.slow
def test_each_bad_answer_is_counted_by_reason(faults, at: float, reason: str) -> None:  # type: ignore[no-untyped-def]
    faults.at(at - 10)
    started = time.monotonic()
    snap = faults.at(at)
    took = time.monotonic() - started
    t = target(snap)
    assert t.up == 0 and t.scrape_errors is not None and t.scrape_errors[reason] == 1
    assert sum(t.scrape_errors.values()) == 1
    assert took < 1.9, "the scrape is cut at engine_timeout, not waited out"
    assert prof(snap) is not None  # the page of 10 s ago still counts


def test_frozen_values_are_stale_after_max_age(faults) -> None:  # type: ignore[no-untyped-def]
    faults.at(695)
    assert prof(faults.at(700)) is not None
    snap = faults.at(780)  # values unchanged for 80 s: DCGM may just be slow
    assert prof(snap) is not None and target(snap).up == 1
    snap = faults.at(800)  # unchanged for 100 s > 90: not a measurement any more
    assert prof(snap) is None and prof(snap, 1) is None
    t = target(snap)
    assert t.up == 1 and t.gpus == {"fresh": 0, "stale": 2, "no_profiling": 0}
    assert t.sample_age_seconds == pytest.approx(0.0)
    assert prof(faults.at(910)) is not None  # sampling again


def test_another_nodes_dcgm_exporter_gives_this_node_nothing(faults) -> None:  # type: ignore[no-untyped-def]
    faults.at(995)
    snap = faults.at(1005)
    t = target(snap)
    assert t.up == 1 and t.gpus == {"fresh": 2, "stale": 0, "no_profiling": 0}
    assert prof(snap) is None and prof(snap, 1) is None
    assert snap.gpu(0).uuid not in t.listed  # type: ignore[union-attr]


def test_self_metrics_are_exposed(faults) -> None:  # type: ignore[no-untyped-def]
    faults.at(20)
    text = faults.text()
    assert 'llmgpu_dcgm_exporter_up{source="simulated",target="http://127.0.0.1:' in text
    assert 'llmgpu_dcgm_exporter_scrape_errors_total{reason="timeout",source="simulated"' in text
    assert 'llmgpu_dcgm_exporter_gpus{source="simulated",state="fresh"' in text
    assert 'llmgpu_gpu_metric_source{gpu="0",metric="llmgpu_gpu_sm_active_ratio",source="dcgm"' in text


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PLAIN = """
gpus: {count: 1, model: A100-80GB-SXM}
phases: [{name: p, duration: 100, gpu: {util: 0.5}}]
"""


def test_a_configured_dcgm_exporter_that_refuses_is_an_error(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(PLAIN, dcgm_exporter=f"127.0.0.1:{closed_port()}")
    snap = s.at(10)
    t = target(snap)
    assert t.up == 0 and t.scrape_errors is not None and t.scrape_errors["refused"] == 1
    assert status_errors(snap) == {"refused": 1}
    assert prof(snap) is None


def test_nobody_at_the_guessed_loopback_port_is_no_error() -> None:
    c = DcgmCollector(Context(settings=Settings(), nvml=None))
    assert c.static == DcgmTarget(LOCAL_URL, "local")
    c.static = DcgmTarget(f"http://127.0.0.1:{closed_port()}/metrics", "local")
    try:
        out = c.collect()
        assert out.errors == {} and out.by_uuid == {}
        reading = out.node[0]
        assert isinstance(reading, DcgmExporters)
        assert reading.targets[0].up == 0 and reading.targets[0].scrape_errors["refused"] == 1  # type: ignore[index]
    finally:
        c.stop()


def test_where_the_dcgm_exporter_is_looked_for() -> None:
    assert resolve(Settings(dcgm_exporter="off")) == (None, None)
    assert resolve(Settings(simulate="healthy")) == (None, None)  # the scenario's own, or none
    static, finder = resolve(Settings(dcgm_exporter="10.0.0.7:9400"))
    assert static == DcgmTarget("http://10.0.0.7:9400/metrics", "configured") and finder is None
    static, finder = resolve(Settings(discover_kubernetes=True, node_name="gpu-7"))
    assert static is None and finder is not None
    assert resolve(Settings()) == (DcgmTarget(LOCAL_URL, "local"), None)
    with pytest.raises(ConfigError, match="dcgm_exporter"):
        resolve(Settings(dcgm_exporter="ftp://x:1"))


def test_discovery_failures_keep_the_last_target() -> None:
    calls: list[int] = []
    url = f"http://127.0.0.1:{closed_port()}/metrics"

    def finder() -> list[DcgmTarget]:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("API server unreachable")
        return [DcgmTarget(url, "kubernetes")]

    c = DcgmCollector(Context(settings=Settings(), nvml=None), finder=finder)
    try:
        assert c.target() == (DcgmTarget(url, "kubernetes"), {})
        c._found_at = -1e18  # the next look is due
        assert c.target() == (DcgmTarget(url, "kubernetes"), {"discovery_RuntimeError": 1})
    finally:
        c.stop()


def test_a_hostile_dcgm_exporter_page_is_refused_by_the_engine_caps() -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from exporter.dcgm.source import DcgmSource
    from exporter.engines.fetch import Limits

    long_name = "A" * 3000  # over the 2048-character default cap on one label value
    page = (
        "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\n"
        f'DCGM_FI_PROF_SM_ACTIVE{{gpu="0",UUID="GPU-1",modelName="{long_name}"}} 0.5\n'
    ).encode()

    class Hostile(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    source = DcgmSource(Limits(timeout_s=3.0, max_bytes=1 << 20, max_series=1000), max_age_s=90.0)
    try:
        got = source.scrape(DcgmTarget(f"http://127.0.0.1:{server.server_address[1]}/metrics", "static"))
    finally:
        source.close()
        server.shutdown()
    assert got.error is not None and got.error.reason == "label_too_long"
    assert got.values == {} and got.reading.up == 0
    assert got.reading.scrape_errors is not None and got.reading.scrape_errors["label_too_long"] == 1


def _gzip_zeros(mib: int) -> bytes:
    import zlib

    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    return b"".join([*(z.compress(block) for _ in range(mib)), z.flush()])


def _peak_rss_growth(run: Callable[[], object]) -> int:
    """Bytes the process' peak RSS rose over its RSS before `run` (VmHWM, reset first)."""

    def kib(key: str) -> int:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key))
        return int(line.split()[1])

    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pytest.skip("this kernel does not let a process reset its peak RSS")
    before = kib("VmRSS")
    run()
    return (kib("VmHWM") - before) * 1024


@pytest.mark.slow
def test_a_compressed_dcgm_exporter_page_inflates_within_the_cap_or_is_refused() -> None:
    """The dcgm-exporter fetch is the engine one: a stacked-gzip page is refused unread, a
    gzip bomb is cut at the cap while it inflates, a gzip page is read."""
    import gzip
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from exporter.dcgm.source import DcgmSource
    from exporter.engines.fetch import Limits

    bomb = _gzip_zeros(256)
    page = (
        b"# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\n"
        b'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-1",modelName="NVIDIA A100-SXM4-80GB"} 0.5\n'
    )
    answers = {"/stacked": ("gzip, gzip", gzip.compress(bomb)), "/bomb": ("gzip", bomb)}
    answers["/good"] = ("gzip", gzip.compress(page))

    class Hostile(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            encoding, body = answers[self.path]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Encoding", encoding)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    source = DcgmSource(Limits(timeout_s=10.0, max_bytes=1 << 20, max_series=1000), max_age_s=90.0)
    got = {}
    try:
        for path in answers:

            def scrape(path: str = path) -> None:
                got[path] = source.scrape(DcgmTarget(base + path, "configured"))

            growth = _peak_rss_growth(scrape)
            assert growth < 24 << 20, f"{path}: peak RSS +{growth >> 20} MiB"
    finally:
        source.close()
        server.shutdown()
        server.server_close()
    for path, reason in (("/stacked", "bad_encoding"), ("/bomb", "too_large")):
        errors = got[path].reading.scrape_errors
        assert got[path].error is not None and got[path].error.reason == reason
        assert got[path].reading.up == 0 and errors is not None and errors[reason] == 1
    assert got["/good"].error is None and got["/good"].values == {"GPU-1": {"sm_active_ratio": 0.5}}
