"""TLS and basic auth from a web config file, in the format Prometheus exporters share.

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional
      client_ca_file: ca.crt                         # optional
    basic_auth_users:
      alice: $2y$10$...                              # bcrypt hash

A request without valid credentials, or without a client certificate where one is
required, is answered 401 and counted by reason. Client certificates are asked for
during the handshake but checked per request, so the refusal is an HTTP answer.
"""

from __future__ import annotations

import base64
import hashlib
import ssl
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml
from uvicorn.protocols.http.h11_impl import H11Protocol

from exporter.config import ConfigError

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
CLIENT_AUTH_TYPES = (
    "NoClientCert",
    "RequireAnyClientCert",
    "RequireAndVerifyClientCert",
    "VerifyClientCertIfGiven",
)
UNPROTECTED = ("/healthz",)  # kubelet probes carry no credentials


@dataclass(frozen=True)
class WebConfig:
    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None
    client_auth_type: str = "NoClientCert"
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash

    @property
    def tls(self) -> bool:
        return self.cert_file is not None

    @property
    def require_client_cert(self) -> bool:
        return self.client_auth_type in ("RequireAnyClientCert", "RequireAndVerifyClientCert")


def load(path: str) -> WebConfig:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"web config {path}: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"web config {path}: must be a mapping")
    unknown = set(data) - {"tls_server_config", "basic_auth_users", "http_server_config"}
    if unknown:
        raise ConfigError(f"web config {path}: unknown key(s) {', '.join(sorted(unknown))}")
    tls = data.get("tls_server_config") or {}
    users = data.get("basic_auth_users") or {}
    if not isinstance(tls, dict) or not isinstance(users, dict):
        raise ConfigError(f"web config {path}: tls_server_config and basic_auth_users must be mappings")
    auth_type = tls.get("client_auth_type", "NoClientCert")
    if auth_type not in CLIENT_AUTH_TYPES:
        raise ConfigError(
            f"web config {path}: client_auth_type must be one of {', '.join(CLIENT_AUTH_TYPES)}"
        )
    if bool(tls.get("cert_file")) != bool(tls.get("key_file")):
        raise ConfigError(f"web config {path}: tls_server_config needs both cert_file and key_file")
    if auth_type != "NoClientCert" and not tls.get("client_ca_file"):
        raise ConfigError(f"web config {path}: client_auth_type {auth_type} needs client_ca_file")
    base = Path(path).parent

    def resolve(p: str | None) -> str | None:  # paths are relative to the file
        return str(base / p) if p else None

    for user, hashed in users.items():
        if not isinstance(hashed, str) or not hashed.startswith("$2"):
            raise ConfigError(f"web config {path}: basic_auth_users.{user} must be a bcrypt hash")
    return WebConfig(
        cert_file=resolve(tls.get("cert_file")),
        key_file=resolve(tls.get("key_file")),
        client_ca_file=resolve(tls.get("client_ca_file")),
        client_auth_type=auth_type,
        users={str(u): str(h).encode() for u, h in users.items()},
    )


def uvicorn_options(cfg: WebConfig) -> dict[str, Any]:
    if not cfg.tls:
        return {}
    opts: dict[str, Any] = {"ssl_certfile": cfg.cert_file, "ssl_keyfile": cfg.key_file, "http": TlsAwareH11}
    if cfg.client_ca_file:
        opts["ssl_ca_certs"] = cfg.client_ca_file
        # Optional at the handshake so a missing certificate becomes a counted 401.
        opts["ssl_cert_reqs"] = ssl.CERT_OPTIONAL
    return opts


class TlsAwareH11(H11Protocol):
    """Puts 'was a client certificate presented' into each request's scope state."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        has_cert = bool(ssl_object is not None and ssl_object.getpeercert())
        self.app_state = {**self.app_state, "client_cert": has_cert}


class AuthMiddleware:
    """Plain ASGI middleware (no per-request task) so scrapes stay cheap."""

    def __init__(self, app: ASGIApp, cfg: WebConfig, on_failure: Callable[[str], None]) -> None:
        self.app = app
        self.cfg = cfg
        self.on_failure = on_failure
        self._verified: set[bytes] = set()  # digests of accepted credentials: bcrypt is slow

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in UNPROTECTED:
            return await self.app(scope, receive, send)
        reason = self._refusal(scope)
        if reason is None:
            return await self.app(scope, receive, send)
        self.on_failure(reason)
        headers = [(b"content-type", b"text/plain")]
        if reason != "client_certificate":
            headers.append((b"www-authenticate", b'Basic realm="llm-gpu-exporter"'))
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": b"Unauthorized\n"})

    def _refusal(self, scope: Scope) -> str | None:
        if self.cfg.require_client_cert and not scope.get("state", {}).get("client_cert"):
            return "client_certificate"
        if not self.cfg.users:
            return None
        header = dict(scope["headers"]).get(b"authorization", b"")
        if not header.lower().startswith(b"basic "):
            return "missing_credentials"
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).partition(b":")
        except ValueError:
            return "bad_credentials"
        hashed = self.cfg.users.get(user.decode(errors="replace"))
        if hashed is None:
            return "bad_credentials"
        digest = hashlib.sha256(user + b"\0" + password + b"\0" + hashed).digest()
        if digest in self._verified:
            return None
        if bcrypt.checkpw(password, hashed.replace(b"$2y$", b"$2b$")):
            self._verified.add(digest)
            return None
        return "bad_credentials"
