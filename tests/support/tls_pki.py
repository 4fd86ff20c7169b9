"""Test helpers: a throwaway CA with server and client certificates, and a live server."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from exporter.web import webconfig
from exporter.web.limits import LimitedServer, ServerLimits, build_server


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(d: Path, certs: Mapping[str, str] | None = None) -> None:
    """ca.crt/ca.key, then NAME.crt/NAME.key signed by it for each NAME -> subjectAltName."""
    certs = certs or {"server": "IP:127.0.0.1", "client": "IP:127.0.0.1"}
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
        "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"),
    )  # fmt: skip
    for name, san in certs.items():
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
            "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"),
        )  # fmt: skip
        ext = d / f"{name}.ext"
        ext.write_text(f"subjectAltName={san}\n")
        _openssl(
            "x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.crt"),
            "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1",
            "-extfile", str(ext), "-out", str(d / f"{name}.crt"),
        )  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def live_server(
    app: Any, web: webconfig.WebConfig | None = None, limits: ServerLimits | None = None
) -> Iterator[tuple[int, LimitedServer]]:
    """The app served as `serve` serves it (limits, TLS), on loopback, in a thread."""
    port = free_port()
    server = build_server(
        app,
        "127.0.0.1",
        port,
        limits or ServerLimits(),
        ssl_context=webconfig.ssl_context(web) if web else None,
        connect_state=webconfig.connect_state(web) if web and web.tls else None,
        log_level="error",
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.started, "server did not start"
        yield port, server
    finally:
        server.should_exit = True
        thread.join(timeout=10)
