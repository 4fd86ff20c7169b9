"""The query client against a small HTTP server on loopback, and the time arguments."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import pytest

from exporter import cli
from exporter.tsdb.client import BadAnswer, Connection, QueryApi, Refused, Unreachable
from exporter.tsdb.timespec import TimeError, duration, moment

MATRIX = {
    "status": "success",
    "data": {
        "resultType": "matrix",
        "result": [{"metric": {"gpu": "0"}, "values": [[10, "1"], [11, "NaN"], [12, "2.5"]]}],
    },
}


class Server:
    """Answers every POST with `self.reply` and keeps what it was sent."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str], dict[str, list[str]]]] = []
        self.replies: list[tuple[int, bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
                outer.seen.append((self.path, dict(self.headers), parse_qs(body)))
                status, data = outer.replies.pop(0) if outer.replies else (200, json.dumps(MATRIX).encode())
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.http.shutdown()
    s.http.server_close()


def test_range_query_sends_the_form_and_drops_nan(server: Server) -> None:
    with QueryApi(Connection(server.url, bearer_token="tok")) as api:
        (series,) = api.query_range("llmgpu_gpu_up", 10, 12, 1)
    path, headers, form = server.seen[0]
    assert path == "/api/v1/query_range"
    assert headers["Authorization"] == "Bearer tok"
    assert form == {"query": ["llmgpu_gpu_up"], "start": ["10.000"], "end": ["12.000"], "step": ["1.000"]}
    assert series.labels == {"gpu": "0"} and series.points == ((10.0, 1.0), (12.0, 2.5))


def test_basic_auth_header(server: Server) -> None:
    with QueryApi(Connection(server.url, user="alice", password="pw")) as api:
        api.query("up", 5)
    auth = server.seen[0][1]["Authorization"]
    assert auth == "Basic " + base64.b64encode(b"alice:pw").decode()


@pytest.mark.parametrize(
    ("status", "body", "error", "text"),
    [
        (401, b"Unauthorized", Refused, "HTTP 401"),
        (200, b"<html>grafana</html>", BadAnswer, "without JSON"),
        (400, json.dumps({"status": "error", "error": "parse error"}).encode(), BadAnswer, "parse error"),
    ],
)
@pytest.mark.slow
def test_errors_are_told_apart(server: Server, status: int, body: bytes, error: type, text: str) -> None:
    server.replies.append((status, body))
    with QueryApi(Connection(server.url)) as api, pytest.raises(error, match=text):
        api.query("up", 5)


def test_an_answer_that_broke_off_is_asked_again(server: Server) -> None:
    server.replies.append((200, b'{"status":"success","data":{"resultType":"matr'))
    with QueryApi(Connection(server.url)) as api:
        assert api.query_range("up", 10, 12, 1)
    assert len(server.seen) == 2


def test_nothing_listening_is_unreachable(server: Server) -> None:
    url = server.url
    server.http.shutdown()
    server.http.server_close()
    with QueryApi(Connection(url, timeout_s=2)) as api, pytest.raises(Unreachable, match="cannot reach"):
        api.query("up", 5)


def test_basic_and_bearer_together_are_refused() -> None:
    with pytest.raises(Exception, match="not both"):
        QueryApi(Connection("http://x", user="a", bearer_token="t"))


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("1m30s", 90.0), ("2h", 7200.0), ("500ms", 0.5)]
)
def test_durations(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "at"),
    [
        ("now", 1000.0),
        ("now-10m", 400.0),
        ("1714532400", 1714532400.0),
        ("2024-05-01T03:00:00Z", 1714532400.0),
        ("2024-05-01T05:00:00+02:00", 1714532400.0),
    ],
)
def test_moments(text: str, at: float) -> None:
    assert moment(text, now=1000.0) == at


@pytest.mark.parametrize("text", ["2024-05-01T03:00:00", "yesterday", "now-5x"])
def test_bad_moments_are_named(text: str) -> None:
    with pytest.raises(TimeError):
        moment(text, now=0.0)


@pytest.mark.parametrize(
    "argv",
    [
        ["--at", "now", "--from", "now-1h"],
        ["--to", "now"],
        ["--from", "now", "--to", "now-1h"],
        ["--at", "tomorrow"],
        ["--instance", "a:1", "--node", "b"],
        ["--time-scale", "0"],
    ],
)
def test_bad_span_options_exit_2(argv: list[str], capsys: Any) -> None:
    assert cli.main(["diagnose", "--prometheus", "http://127.0.0.1:9", *argv]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.startswith("llm-gpu-exporter: ")
