"""The HTTP side: cached bytes, content negotiation, readiness, auth and TLS."""

from __future__ import annotations

import base64
import gzip
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from exporter import webconfig
from exporter.config import ConfigError
from exporter.server import create_app

SCENARIO = """
gpus: {count: 2, model: H100-80GB-SXM}
phases: [{name: p, duration: 100, gpu: {util: 0.5}}]
"""


@pytest.fixture
def client(sim) -> Iterator[tuple[TestClient, object]]:  # type: ignore[no-untyped-def]
    s = sim(SCENARIO)
    s.at(1)
    yield TestClient(create_app(s.runner)), s


def test_metrics_plain_gzip_and_openmetrics(client) -> None:  # type: ignore[no-untyped-def]
    c, s = client
    plain = c.get("/metrics", headers={"accept-encoding": "identity"})
    assert plain.status_code == 200 and plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert plain.content == s.runner.published.text  # the cached bytes, not a new render
    zipped = c.get("/metrics", headers={"accept-encoding": "gzip"})
    assert zipped.content == plain.content  # the client undid the cached gzip body
    assert zipped.headers["content-encoding"] == "gzip"
    assert gzip.decompress(s.runner.published.text_gzip) == plain.content
    om = c.get("/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.endswith("# EOF\n")
    s.at(2)
    assert "llmgpu_exporter_scrapes_total 3.0" in c.get("/metrics").text


def test_health_readiness_and_json(client) -> None:  # type: ignore[no-untyped-def]
    c, _ = client
    assert c.get("/healthz").text == "ok\n"
    ready = c.get("/readyz").json()
    assert ready["ready"] is True and [g["up"] for g in ready["gpus"]] == [True, True]
    snap = c.get("/api/v1/snapshot").json()
    assert snap["simulated"] is True and snap["gpus"][1]["readings"]["Utilization"]["gpu_busy_ratio"] > 0.4


def test_not_ready_before_first_sample(sim) -> None:  # type: ignore[no-untyped-def]
    c = TestClient(create_app(sim(SCENARIO).runner))
    assert c.get("/readyz").status_code == 503
    assert c.get("/metrics").status_code == 503
    assert c.get("/healthz").status_code == 200


def _webconfig(tmp_path: Path, text: str) -> webconfig.WebConfig:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return webconfig.load(str(path))


def test_basic_auth(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")
    web = _webconfig(tmp_path, f"basic_auth_users:\n  alice: '{hashed}'\n")
    s = sim(SCENARIO)
    s.at(1)
    c = TestClient(create_app(s.runner, web))

    def auth(user: str, password: str) -> dict[str, str]:
        return {"authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}

    assert c.get("/metrics").status_code == 401
    assert c.get("/metrics", headers=auth("alice", "wrong")).status_code == 401
    assert c.get("/metrics", headers=auth("bob", "s3cret")).status_code == 401
    assert c.get("/metrics", headers=auth("alice", "s3cret")).status_code == 200
    assert c.get("/healthz").status_code == 200  # probes carry no credentials
    s.at(2)
    text = c.get("/metrics", headers=auth("alice", "s3cret")).text
    assert 'llmgpu_exporter_auth_failures_total{reason="bad_credentials"} 2.0' in text
    assert 'llmgpu_exporter_auth_failures_total{reason="missing_credentials"} 1.0' in text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("basic_auth_users:\n  alice: plain\n", "bcrypt hash"),
        ("tls_server_config:\n  cert_file: a.crt\n", "both cert_file and key_file"),
        ("tls_server_config: {cert_file: a, key_file: b, client_auth_type: Sometimes}\n", "client_auth_type"),
        ("surprise: 1\n", "unknown key"),
    ],
)
def test_bad_web_config_is_named(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _webconfig(tmp_path, text)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _pki(d: Path) -> None:
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        str(d / "ca.key"),
        "-out",
        str(d / "ca.crt"),
    )
    for name in ("server", "client"):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            str(d / f"{name}.key"),
            "-out",
            str(d / f"{name}.csr"),
        )
        ext = d / f"{name}.ext"
        ext.write_text("subjectAltName=IP:127.0.0.1\n")
        _openssl(
            "x509",
            "-req",
            "-in",
            str(d / f"{name}.csr"),
            "-CA",
            str(d / "ca.crt"),
            "-CAkey",
            str(d / "ca.key"),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            str(ext),
            "-out",
            str(d / f"{name}.crt"),
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_tls_with_client_certificates(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _pki(tmp_path)
    web = _webconfig(
        tmp_path,
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n",
    )
    s = sim(SCENARIO)
    s.at(1)
    port = _free_port()
    config = uvicorn.Config(
        create_app(s.runner, web),
        host="127.0.0.1",
        port=port,
        log_level="error",
        **webconfig.uvicorn_options(web),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        url = f"https://127.0.0.1:{port}/metrics"
        trust = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        assert httpx.get(url, verify=trust).status_code == 401  # TLS, but no client certificate
        trust.load_cert_chain(str(tmp_path / "client.crt"), str(tmp_path / "client.key"))
        ok = httpx.get(url, verify=trust)
        assert ok.status_code == 200 and "llmgpu_gpu_up" in ok.text
        assert s.runner.stats.auth_failures["client_certificate"] == 1
    finally:
        server.should_exit = True
        thread.join(timeout=10)
