"""Hostile and broken engine endpoints, against loopback servers started here.

Each bad input gets its own server (its own host:port, so its own `target` label):
refused connections, HTTP 500, HTML, binary garbage, a 50 MiB body, 100 000 label
values, a 1 MiB label value, 40 KB model names, 100 labels on a series, and a response
that never finishes. Each must end as up=0 with its reason
counted, within its timeout, while a good target beside them keeps reporting and the
exposition of the whole stays valid.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import socket
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.engines.readings import Engines, EngineTargetReading
from exporter.engines.scraper import EngineScraper, ScrapeConfig
from exporter.engines.targets import Target
from exporter.snapshot import Snapshot
from exporter.web.exposition import render

ROOT = Path(__file__).resolve().parents[2]
GOOD_PAGE = (ROOT / "tests" / "fixtures" / "vllm" / "vllm-0.32-cpu-loaded.txt").read_bytes()
MiB = 1024 * 1024
TIMEOUT_S = 1.0

Respond = Callable[[BaseHTTPRequestHandler], None]


class Server:
    """A loopback HTTP server whose every GET is answered by `respond`."""

    def __init__(self, respond: Respond, port: int = 0) -> None:
        self.sent = 0
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                outer.requests += 1
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    respond(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def send(h: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str = "text/plain") -> None:
    h.send_response(status)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def good(h: BaseHTTPRequestHandler) -> None:
    send(h, 200, GOOD_PAGE, "text/plain; version=0.0.4")


def status_500(h: BaseHTTPRequestHandler) -> None:
    send(h, 500, b"Internal Server Error")


def html(h: BaseHTTPRequestHandler) -> None:
    send(h, 200, b"<!doctype html><html><body><h1>Welcome</h1></body></html>", "text/html")


def html_as_text(h: BaseHTTPRequestHandler) -> None:
    send(h, 200, b"<html><head><title>login</title></head></html>\n")


def garbage(h: BaseHTTPRequestHandler) -> None:
    send(h, 200, os.urandom(64 * 1024))


def text_garbage(h: BaseHTTPRequestHandler) -> None:
    send(h, 200, b'vllm:num_requests_running{model_name="x" 1\n}}} nonsense =\n')


def huge(server_ref: list[Server]) -> Respond:
    def respond(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Connection", "close")  # no length: the body runs until we stop
        h.end_headers()
        line = b'vllm:num_requests_running{model_name="m"} 1\n' * 1024
        for _ in range(50 * MiB // len(line)):
            h.wfile.write(line)
            server_ref[0].sent += len(line)

    return respond


def huge_declared(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/plain")
    h.send_header("Content-Length", str(50 * MiB))
    h.end_headers()
    h.wfile.write(b"# a body that claims 50 MiB\n")


def many_series(h: BaseHTTPRequestHandler) -> None:
    body = "".join(f'vllm:num_requests_running{{model_name="m{i}"}} 1\n' for i in range(100_000)).encode()
    assert len(body) < 8 * MiB  # under the size cap: the series cap must catch it
    send(h, 200, body)


def with_line(line: str) -> Respond:
    """The good vLLM page with one hostile sample line added: the rest is valid."""
    body = GOOD_PAGE + line.encode() + b"\n"

    def respond(h: BaseHTTPRequestHandler) -> None:
        send(h, 200, body, "text/plain; version=0.0.4")

    return respond


MIB_LABEL = 'vllm:num_requests_running{model_name="' + "m" * MiB + '"} 1'
LONG_MODEL = 'vllm:num_requests_waiting{model_name="' + "org/" * 10_000 + '"} 1'  # 40 KB
MANY_LABELS = "vllm:num_requests_running{" + ",".join(f'l{i}="v"' for i in range(100)) + "} 1"


def never_finishes(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/plain")
    h.send_header("Content-Length", "100000")
    h.end_headers()
    for _ in range(600):  # a byte every 0.1 s: no read ever times out, the whole does
        h.wfile.write(b"#")
        h.wfile.flush()
        time.sleep(0.1)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def servers() -> Iterator[dict[str, Server]]:
    ref: list[Server] = []
    made = {
        "good": Server(good),
        "status_500": Server(status_500),
        "html": Server(html),
        "html_as_text": Server(html_as_text),
        "garbage": Server(garbage),
        "text_garbage": Server(text_garbage),
        "huge": Server(huge(ref)),
        "huge_declared": Server(huge_declared),
        "many_series": Server(many_series),
        "never_finishes": Server(never_finishes),
        "mib_label": Server(with_line(MIB_LABEL)),
        "long_model": Server(with_line(LONG_MODEL)),
        "many_labels": Server(with_line(MANY_LABELS)),
    }
    ref.append(made["huge"])
    yield made
    for s in made.values():
        s.stop()


EXPECTED = {
    "status_500": "http_status",
    "html": "not_prometheus",
    "html_as_text": "not_prometheus",
    "garbage": "not_prometheus",
    "text_garbage": "not_prometheus",
    "huge": "too_large",
    "huge_declared": "too_large",
    "many_series": "too_many_series",
    "never_finishes": "timeout",
    "refused": "refused",
    "dns": "dns",
    "mib_label": "label_too_long",
    "long_model": "label_too_long",
    "many_labels": "too_many_labels",
}


def scraper_for(servers: dict[str, Server]) -> tuple[EngineScraper, dict[str, str]]:
    urls = {name: s.url for name, s in servers.items()}
    urls["refused"] = f"http://127.0.0.1:{closed_port()}/metrics"
    urls["dns"] = "http://target.invalid:8000/metrics"  # .invalid never resolves (RFC 2606)
    # the big bodies get a target timeout of their own: on a loaded machine, sending 8 MiB
    # may take longer than the hanging target is allowed, and they must end on their cap
    slow = {"huge", "huge_declared", "many_series"}
    scraper = EngineScraper(
        ScrapeConfig(interval_s=0.5, timeout_s=TIMEOUT_S),
        [
            Target(url=u, kind="vllm" if n == "good" else None, timeout_s=15.0 if n in slow else None)
            for n, u in urls.items()
        ],
    )
    return scraper, {n: Target(url=u).name for n, u in urls.items()}


def by_name(engines: Engines, names: dict[str, str]) -> dict[str, EngineTargetReading]:
    out = {}
    for kind, name in names.items():
        found = engines.target(name)
        assert found is not None, kind
        out[kind] = found
    return out


@pytest.mark.slow
def test_every_bad_input_is_down_with_its_reason_and_the_good_one_keeps_working(
    servers: dict[str, Server],
) -> None:
    scraper, names = scraper_for(servers)
    started = time.monotonic()
    scraper.refresh()
    took = time.monotonic() - started
    got = by_name(scraper.readings(), names)

    slowest = max(t.scrape_duration_seconds or 0.0 for t in got.values())
    assert took < slowest + 1.5, f"targets are scraped concurrently: {took:.1f} s, slowest {slowest:.1f} s"
    hang = got["never_finishes"].scrape_duration_seconds or 0.0
    assert TIMEOUT_S - 0.05 <= hang < TIMEOUT_S + 2.0, "cut off at its timeout, not later"
    for kind, reason in EXPECTED.items():
        t = got[kind]
        assert not t.up, kind
        assert t.status[0].up == 0
        assert t.scrape_errors is not None and t.scrape_errors[reason] == 1, (kind, t.scrape_errors)
        assert sum(t.scrape_errors.values()) == 1, (kind, t.scrape_errors)
        assert t.series == (), f"{kind}: no engine series from a failed scrape"
        assert t.last_error and reason in t.last_error
    ok = got["good"]
    assert ok.up and ok.series and ok.series[0].generation_tokens
    assert ok.scrape_errors is not None and sum(ok.scrape_errors.values()) == 0
    # the 50 MiB body was abandoned near the cap, not read to its end
    assert servers["huge"].sent < 30 * MiB

    # a second round counts again, and the whole still renders to valid exposition text
    scraper.refresh()
    again = by_name(scraper.readings(), names)
    assert again["status_500"].scrape_errors is not None
    assert again["status_500"].scrape_errors["http_status"] == 2
    text = render(Snapshot(taken_at=0.0, node={Engines: (scraper.readings(),)})).text.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    ups = {s.labels["target"]: s.value for s in families["llmgpu_engine_up"].samples}
    assert ups[names["good"]] == 1.0
    assert all(ups[names[k]] == 0.0 for k in EXPECTED)
    reasons = {
        (s.labels["target"], s.labels["reason"]): s.value
        for s in families["llmgpu_engine_scrape_errors"].samples
    }
    assert reasons[(names["never_finishes"], "timeout")] == 2
    assert reasons[(names["good"], "timeout")] == 0, "every reason exported from 0 on"


@pytest.mark.slow
def test_memory_stays_bounded_on_the_50_mib_body_and_the_100k_series_page(
    servers: dict[str, Server],
) -> None:
    targets = [Target(url=servers["huge"].url), Target(url=servers["many_series"].url)]
    scraper = EngineScraper(ScrapeConfig(timeout_s=5.0), targets)
    tracemalloc.start()
    try:
        scraper.refresh()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40 * MiB, f"peak {peak / MiB:.1f} MiB"
    reasons = {t.target: t.last_error or "" for t in scraper.readings().targets}
    assert any("too_large" in r for r in reasons.values())
    assert any("too_many_series" in r for r in reasons.values())


def test_a_hanging_target_does_not_hold_the_others_in_the_background(
    servers: dict[str, Server],
) -> None:
    targets = [Target(url=servers["never_finishes"].url), Target(url=servers["good"].url)]
    scraper = EngineScraper(ScrapeConfig(interval_s=0.2, timeout_s=3.0), targets)
    scraper.start()
    try:
        deadline = time.monotonic() + 5.0
        good_name = targets[1].name
        scrapes_of_good = 0
        while time.monotonic() < deadline:
            t = scraper.readings().target(good_name)
            if t is not None and t.up:
                scrapes_of_good = servers["good"].requests
                if scrapes_of_good >= 3:
                    break
            time.sleep(0.05)
        # the good target was scraped several times while the hanging one held its 3 s
        assert scrapes_of_good >= 3
        hanging = scraper.readings().target(targets[0].name)
        assert hanging is None or not hanging.up
    finally:
        scraper.stop()


def test_a_target_added_while_running_is_scraped_at_once(servers: dict[str, Server]) -> None:
    # Without engines and discovery the scraper's loop sleeps; adding a target wakes it.
    scraper = EngineScraper(ScrapeConfig(interval_s=0.2, timeout_s=TIMEOUT_S), [])
    scraper.start()
    try:
        time.sleep(0.3)
        target = Target(url=servers["good"].url)
        added = time.monotonic()
        scraper.add(target)
        while time.monotonic() - added < 5.0:
            reading = scraper.readings().target(target.name)
            if reading is not None and reading.up:
                break
            time.sleep(0.02)
        assert reading is not None and reading.up
        assert time.monotonic() - added < 0.5  # not at the next discovery round
    finally:
        scraper.stop()


def test_a_restarted_engine_is_picked_up_again() -> None:
    server = Server(good)
    target = Target(url=server.url)
    scraper = EngineScraper(ScrapeConfig(timeout_s=TIMEOUT_S), [target])
    scraper.refresh()
    first = scraper.readings().target(target.name)
    assert first is not None and first.up
    server.stop()
    scraper.refresh()
    down = scraper.readings().target(target.name)
    assert down is not None and not down.up
    assert down.scrape_errors is not None and down.scrape_errors["refused"] == 1
    assert down.status[0].model == "tiny", "the last known model keeps the up series stable"
    back = Server(good, port=server.port)  # the engine comes back on its port
    try:
        scraper.refresh()
        up = scraper.readings().target(target.name)
        assert up is not None and up.up and up.series
        assert up.scrape_errors is not None and up.scrape_errors["refused"] == 1
    finally:
        back.stop()


def test_a_target_state_change_is_logged_once_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    url = f"http://127.0.0.1:{closed_port()}/metrics"
    scraper = EngineScraper(ScrapeConfig(interval_s=0.5, timeout_s=TIMEOUT_S), [Target(url=url)])
    with caplog.at_level(logging.INFO, logger="exporter.engines.scraper"):
        for _ in range(3):
            scraper.refresh()
    lines = [r.getMessage() for r in caplog.records if url in r.getMessage()]
    assert len(lines) == 1 and "is down: refused" in lines[0], lines


def test_label_caps_count_what_the_value_says_not_how_it_is_escaped() -> None:
    from exporter.engines.fetch import ScrapeError, parse

    at_cap = 'vllm:num_requests_running{model_name="' + "a" * 64 + '"} 1\n'
    assert parse(at_cap.encode(), 10, max_labels=4, max_label_length=64)[0].samples[0].value == 1
    escaped = 'vllm:num_requests_running{model_name="' + '\\"' * 64 + '"} 1\n'  # 64 quote characters
    assert parse(escaped.encode(), 10, max_labels=4, max_label_length=64)
    with pytest.raises(ScrapeError) as err:
        parse(('x{m="' + "a" * 65 + '"} 1\n').encode(), 10, max_labels=4, max_label_length=64)
    assert err.value.reason == "label_too_long"
    five = "x{" + ",".join(f'l{i}="{"," * 3}"' for i in range(5)) + "} 1\n"  # commas inside values
    with pytest.raises(ScrapeError) as err:
        parse(five.encode(), 10, max_labels=4, max_label_length=64)
    assert err.value.reason == "too_many_labels"
    four = "x{" + ",".join(f'l{i}="a"' for i in range(4)) + "} 1\n"
    assert len(parse(four.encode(), 10, max_labels=4, max_label_length=64)[0].samples[0].labels) == 4


# ---- compressed pages: inflated within the cap, or refused ---------------------------------


def zeros(mib: int, wbits: int) -> bytes:
    """mib MiB of zero bytes, compressed: gzip (wbits 31) or zlib-wrapped deflate (15)."""
    z = zlib.compressobj(6, zlib.DEFLATED, wbits)
    block = bytes(MiB)
    return b"".join([*(z.compress(block) for _ in range(mib)), z.flush()])


@pytest.fixture(scope="module")
def bombs() -> dict[str, tuple[str, bytes]]:
    """name -> (Content-Encoding, body): each inflates to 256 MiB, or is not gzip as asked."""
    gz = zeros(256, 31)
    return {
        "gzip": ("gzip", gz),  # 260 KB
        "gzip_gzip": ("gzip, gzip", gzip.compress(gz)),  # under 1 KB, 256 MiB after two inflations
        "deflate": ("deflate", zeros(256, 15)),
        "br": ("br", GOOD_PAGE),  # a coding not asked for is refused, whatever it would decode to
        "zstd": ("zstd", GOOD_PAGE),
        "truncated": ("gzip", gzip.compress(GOOD_PAGE)[:-100]),
    }


BOMB_REASONS = {
    "gzip": "too_large",
    "gzip_gzip": "bad_encoding",
    "deflate": "bad_encoding",
    "br": "bad_encoding",
    "zstd": "bad_encoding",
    "truncated": "bad_encoding",
}


def encoded(encoding: str, body: bytes, seen: list[str] | None = None) -> Respond:
    def respond(h: BaseHTTPRequestHandler) -> None:
        if seen is not None:
            seen.append(h.headers.get("accept-encoding", ""))
        h.send_response(200)
        h.send_header("Content-Type", "text/plain; version=0.0.4")
        h.send_header("Content-Encoding", encoding)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return respond


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def peak_rss_growth(run: Callable[[], object]) -> int:
    """Bytes the process' peak RSS rose over its RSS before `run` (VmHWM, reset first)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        pytest.skip("this kernel does not let a process reset its peak RSS")
    before = _status_kib("VmRSS")
    run()
    return (_status_kib("VmHWM") - before) * 1024


@pytest.mark.parametrize("name", list(BOMB_REASONS))
@pytest.mark.slow
def test_a_compressed_page_inflates_within_the_cap_or_is_refused(
    bombs: dict[str, tuple[str, bytes]], name: str
) -> None:
    encoding, body = bombs[name]
    server = Server(encoded(encoding, body))
    target = Target(url=server.url)
    scraper = EngineScraper(ScrapeConfig(timeout_s=10.0, max_bytes=MiB), [target])
    try:
        growth = peak_rss_growth(scraper.refresh)
    finally:
        server.stop()
    got = scraper.readings().target(target.name)
    assert got is not None and not got.up and got.series == ()
    assert got.scrape_errors is not None and got.scrape_errors[BOMB_REASONS[name]] == 1, got.last_error
    # 1 MiB of page kept at most, a read at a time inflated: not 256 MiB, not GiBs
    assert growth < 24 * MiB, f"peak RSS +{growth / MiB:.0f} MiB"


def test_a_gzip_page_is_read_and_only_gzip_is_asked_for() -> None:
    members = gzip.compress(GOOD_PAGE[:5000]) + gzip.compress(GOOD_PAGE[5000:])  # two gzip members
    seen: list[str] = []
    servers = [Server(encoded("gzip", gzip.compress(GOOD_PAGE), seen)), Server(encoded("x-gzip", members))]
    targets = [Target(url=s.url, kind="vllm") for s in servers]
    scraper = EngineScraper(ScrapeConfig(timeout_s=5.0), targets)
    try:
        scraper.refresh()
    finally:
        for s in servers:
            s.stop()
    plain = Server(good)
    try:
        reference = EngineScraper(ScrapeConfig(timeout_s=5.0), [Target(url=plain.url, kind="vllm")])
        reference.refresh()
    finally:
        plain.stop()
    expected = reference.readings().targets[0].series
    for target in targets:
        got = scraper.readings().target(target.name)
        assert got is not None and got.up, got and got.last_error
        assert [s.generation_tokens for s in got.series] == [s.generation_tokens for s in expected]
    assert seen == ["gzip"]


BOMB_SCENARIO = """
gpus: {count: 1, model: H100-80GB-SXM}
phases: [{name: p, duration: 100000, gpu: {util: 0.5}}]
"""


@pytest.mark.slow
def test_the_exporter_serves_on_while_an_engine_sends_bombs(sim, bombs) -> None:  # type: ignore[no-untyped-def]
    """A live exporter scraping a stacked-gzip and a gzip bomb twice a second: its peak RSS
    stays flat and every /metrics answers, with the refusals counted by reason."""
    import httpx

    from exporter.web.server import create_app
    from tests.support.tls_pki import live_server

    hostile = [Server(encoded(*bombs["gzip_gzip"])), Server(encoded(*bombs["gzip"]))]
    s = sim(
        BOMB_SCENARIO,
        collectors_disabled=("allocator",),
        engines=tuple(h.url for h in hostile),
        engine_interval=0.5,
        engine_max_bytes=MiB,
        interval=0.5,
    )
    s.runner.start()
    slowest = 0.0
    text = ""

    def scrape_for(seconds: float) -> None:
        nonlocal slowest, text
        stop = time.monotonic() + seconds
        with httpx.Client(timeout=10) as client:
            while time.monotonic() < stop:
                started = time.monotonic()
                got = client.get(url)
                slowest = max(slowest, time.monotonic() - started)
                if got.status_code == 200:
                    text = got.text
                time.sleep(0.1)

    try:
        with live_server(create_app(s.runner)) as (port, _):
            url = f"http://127.0.0.1:{port}/metrics"
            growth = peak_rss_growth(lambda: scrape_for(4.0))
    finally:
        for h in hostile:
            h.stop()
    assert growth < 48 * MiB, f"peak RSS +{growth / MiB:.0f} MiB"
    assert slowest < 2.0, f"a /metrics took {slowest:.1f} s"
    stacked, single = (Target(url=h.url).name for h in hostile)
    errors = {
        (f.labels["target"], f.labels["reason"]): f.value
        for fam in text_string_to_metric_families(text)
        if fam.name == "llmgpu_engine_scrape_errors"
        for f in fam.samples
    }
    assert errors[(stacked, "bad_encoding")] >= 2 and errors[(single, "too_large")] >= 2, errors


def test_two_engines_behind_one_host_port_have_labels_of_their_own() -> None:
    """A gateway that serves two engines at two paths of one port: each target is labelled
    with its path, so no series is written twice; one at /metrics keeps host:port."""
    server = Server(good)
    base = f"http://127.0.0.1:{server.port}"
    targets = [Target(url=base + "/metrics", kind="vllm"), Target(url=base + "/b/metrics", kind="vllm")]
    scraper = EngineScraper(ScrapeConfig(timeout_s=5.0), targets)
    try:
        scraper.refresh()
    finally:
        server.stop()
    text = render(Snapshot(taken_at=0.0, node={Engines: (scraper.readings(),)})).text.decode()
    samples = [
        (s.name, tuple(sorted(s.labels.items())))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith("llmgpu_engine")
    ]
    assert len(samples) == len(set(samples)), "a series written twice"
    names = [t.name for t in targets]
    assert names == [f"127.0.0.1:{server.port}", f"127.0.0.1:{server.port}/b/metrics"]
    assert all(r is not None and r.up for r in map(scraper.readings().target, names))


def test_a_page_of_19000_models_is_read_for_the_first_16_and_the_rest_counted() -> None:
    flood = "".join(f'vllm:num_requests_running{{model_name="m{i:05d}"}} 1\n' for i in range(19_000))
    server = Server(with_line(flood.rstrip("\n")))  # the real page (model "tiny") first
    target = Target(url=server.url, kind="vllm")
    scraper = EngineScraper(ScrapeConfig(timeout_s=10.0), [target])
    try:
        scraper.refresh()
    finally:
        server.stop()
    text = render(Snapshot(taken_at=0.0, node={Engines: (scraper.readings(),)})).text.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    models = {s.labels["model"] for f in families.values() for s in f.samples if "model" in s.labels}
    assert len(models) == 16 and "tiny" in models, len(models)
    dropped = families["llmgpu_engine_dropped_models"].samples[0]
    assert dropped.labels["target"] == target.name and dropped.value == 19_000 - 15
    got = scraper.readings().target(target.name)
    assert got is not None and got.up
    tiny = next(s for s in got.series if s.model == "tiny")
    assert tiny.generation_tokens and tiny.ttft is not None, "the engine's own model is read whole"
    assert len(text) < 200_000, f"{len(text)} bytes of exposition"
