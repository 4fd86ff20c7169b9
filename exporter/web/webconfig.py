"""TLS, basic auth and response headers from a web config file, in the format Prometheus
exporters share (prometheus/exporter-toolkit, docs/web-configuration.md):

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional
      client_ca_file: ca.crt                         # optional
      client_allowed_sans: [prometheus.example]      # optional
      min_version: TLS12                             # optional; also max_version
      cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]
      curve_preferences: [X25519]
      prefer_server_cipher_suites: true
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
      http2: true
    basic_auth_users:
      alice: $2y$10$...                              # bcrypt hash

Every key is applied or the file is refused with an error naming it: a security setting
is never ignored. A password hash is checked at load too: its form, and a cost a node
agent can afford (MAX_BCRYPT_COST). Where Python's ssl module cannot do what Go's crypto/tls does, the
stricter choice is made or the value refused (see docs/security.md). A request without
valid credentials, without a client certificate where one is required, or whose
certificate carries none of the allowed SANs, is answered 401 and counted by reason:
certificates are checked at the handshake, the policy per request, so the refusal is an
HTTP answer. Passwords are checked as exporter-toolkit checks them (web/handler.go): one
bcrypt at a time, off the event loop (a check costs tens of milliseconds, and every
request waited behind it, /healthz too); accepted credentials remembered (a digest of
user, password and hash; bounded); an unknown user checked against a hash of the same
cost, so that the time of a refusal does not tell which users exist.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import ipaddress
import re
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from exporter.config import ConfigError

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
CLIENT_AUTH_TYPES = (
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
)
VERIFYING = ("RequireAnyClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# exporter-toolkit's names that cannot be honoured: OpenSSL 3 offers no cipher for them at
# its default security level, and RFC 8996 retires both.
RETIRED_TLS = ("TLS10", "TLS11")
# Go's crypto/tls names -> OpenSSL's. TLS 1.3 suites are not configurable, in Go as here.
CIPHER_SUITES = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
TLS13_SUITES = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}
# The headers exporter-toolkit lets a web config set, with the values it allows (None: any).
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
TLS_KEYS = (
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "cipher_suites",
    "curve_preferences",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
    "client_allowed_sans",
)
INLINE_KEYS = {"cert": "cert_file", "key": "key_file", "client_ca": "client_ca_file"}
UNPROTECTED = ("/healthz",)  # kubelet probes carry no credentials
BCRYPT_HASH = re.compile(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}")
# A cost c is 2^c rounds: here cost 10 takes about 60 ms of one core, 12 (Python bcrypt's
# default) 0.25 s, 14 one second. Each wrong password, and the first request with a
# right one, pays one check: past 14 a few of them outlast a 10 s scrape timeout, and
# cost 31 would take a core for days per check.
MAX_BCRYPT_COST = 14
VERIFIED_KEEP = 64  # accepted credentials remembered; a wrong password never is
# One check at a time, process-wide: a flood of wrong passwords costs one core at most.
_BCRYPT = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bcrypt")


@dataclass(frozen=True)
class WebConfig:
    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None
    client_auth_type: str = "NoClientCert"
    cipher_suites: tuple[str, ...] = ()  # Go names
    curve: str | None = None  # Go name
    min_version: str = "TLS12"  # exporter-toolkit's default
    max_version: str | None = None
    prefer_server_cipher_suites: bool = True
    client_allowed_sans: tuple[str, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    http2: bool = True
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash

    @property
    def tls(self) -> bool:
        return self.cert_file is not None

    @property
    def require_client_cert(self) -> bool:
        return self.client_auth_type in ("RequireAnyClientCert", "RequireAndVerifyClientCert")

    @property
    def checks_requests(self) -> bool:
        return bool(self.users or self.require_client_cert or self.client_allowed_sans)


class _Refuse(ConfigError):
    pass


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Refuse(f"{where} must be a mapping")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Refuse(f"{where} must be a list of strings")
    return tuple(value)


def _bool(value: Any, where: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _Refuse(f"{where} must be true or false")
    return value


def _unknown(data: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    for key in data:
        if key in INLINE_KEYS and where == "tls_server_config":
            raise _Refuse(f"{where}.{key} (inline PEM) is not supported: use {INLINE_KEYS[key]}")
        if key not in known:
            raise _Refuse(f"unknown key {where}.{key}; known: {', '.join(known)}")


def load(path: str) -> WebConfig:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"web config {path}: {err}") from err
    try:
        cfg = _parse(_mapping(data, "the file"), Path(path).parent)
        ssl_context(cfg)  # a bad certificate, key or cipher list is refused now, not at the first client
    except _Refuse as err:
        raise ConfigError(f"web config {path}: {err}") from None
    return cfg


def _parse(data: Mapping[str, Any], base: Path) -> WebConfig:
    _unknown(data, ("tls_server_config", "http_server_config", "basic_auth_users"), "the file")
    tls = _mapping(data.get("tls_server_config"), "tls_server_config")
    http = _mapping(data.get("http_server_config"), "http_server_config")
    users = _mapping(data.get("basic_auth_users"), "basic_auth_users")
    _unknown(tls, TLS_KEYS, "tls_server_config")
    _unknown(http, ("headers", "http2"), "http_server_config")

    def resolve(key: str) -> str | None:  # paths are relative to the file
        value = tls.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise _Refuse(f"tls_server_config.{key} must be a path")
        return str(base / value)

    cert, key, ca = resolve("cert_file"), resolve("key_file"), resolve("client_ca_file")
    if bool(cert) != bool(key):
        raise _Refuse("tls_server_config needs both cert_file and key_file")
    if cert is None and any(tls.get(k) not in (None, "", []) for k in TLS_KEYS):
        given = ", ".join(k for k in TLS_KEYS if tls.get(k) not in (None, "", []))
        raise _Refuse(f"tls_server_config sets {given} but no cert_file and key_file: it would not apply")
    auth_type = tls.get("client_auth_type") or "NoClientCert"
    if auth_type not in CLIENT_AUTH_TYPES:
        raise _Refuse(f"tls_server_config.client_auth_type must be one of {', '.join(CLIENT_AUTH_TYPES)}")
    if auth_type in VERIFYING and not ca:
        raise _Refuse(f"tls_server_config.client_auth_type {auth_type} needs client_ca_file")
    sans = _strings(tls.get("client_allowed_sans"), "tls_server_config.client_allowed_sans")
    if sans and auth_type not in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert"):
        raise _Refuse(
            "tls_server_config.client_allowed_sans needs client_auth_type RequireAndVerifyClientCert "
            "or VerifyClientCertIfGiven: the SANs of an unverified certificate prove nothing"
        )

    def version(key: str) -> str | None:
        value = tls.get(key)
        if value is None:
            return None
        if value in RETIRED_TLS:
            raise _Refuse(
                f"tls_server_config.{key} {value} cannot be honoured: this OpenSSL offers TLS 1.2 "
                "at least (TLS 1.0 and 1.1 are retired by RFC 8996); use TLS12 or TLS13"
            )
        if value not in TLS_VERSIONS:
            raise _Refuse(f"tls_server_config.{key} must be one of {', '.join(TLS_VERSIONS)}, got {value!r}")
        return str(value)

    low, high = version("min_version") or "TLS12", version("max_version")
    if high is not None and TLS_VERSIONS[high] < TLS_VERSIONS[low]:
        raise _Refuse(f"tls_server_config.max_version {high} is below min_version {low}")
    suites = _strings(tls.get("cipher_suites"), "tls_server_config.cipher_suites")
    for suite in suites:
        if suite in TLS13_SUITES:
            raise _Refuse(
                f"tls_server_config.cipher_suites: {suite} is a TLS 1.3 suite, which cannot be chosen"
            )
        if suite not in CIPHER_SUITES:
            raise _Refuse(f"tls_server_config.cipher_suites: unknown or unsupported suite {suite}")
    if suites and low == "TLS13":
        raise _Refuse("tls_server_config.cipher_suites choose among TLS 1.2 suites, but min_version is TLS13")
    curves = _strings(tls.get("curve_preferences"), "tls_server_config.curve_preferences")
    for curve in curves:
        if curve not in CURVES:
            raise _Refuse(
                f"tls_server_config.curve_preferences: unknown curve {curve}; known: {', '.join(CURVES)}"
            )
    if len(curves) > 1:
        raise _Refuse(
            "tls_server_config.curve_preferences: give one curve; Python's ssl module can restrict "
            "the key exchange to one group but cannot order several"
        )
    headers = _mapping(http.get("headers"), "http_server_config.headers")
    for name, value in headers.items():
        if name not in HEADERS:
            raise _Refuse(f"http_server_config.headers: {name} can not be configured")
        allowed = HEADERS[name]
        if not isinstance(value, str) or (allowed is not None and value not in allowed):
            raise _Refuse(f"http_server_config.headers: {name} must be one of {allowed}, got {value!r}")
    return WebConfig(
        cert_file=cert,
        key_file=key,
        client_ca_file=ca,
        client_auth_type=auth_type,
        cipher_suites=suites,
        curve=curves[0] if curves else None,
        min_version=low,
        max_version=high,
        prefer_server_cipher_suites=_bool(
            tls.get("prefer_server_cipher_suites"), "tls_server_config.prefer_server_cipher_suites", True
        ),
        client_allowed_sans=sans,
        headers={str(k): str(v) for k, v in headers.items()},
        http2=_bool(http.get("http2"), "http_server_config.http2", True),
        users={str(u): _bcrypt_hash(str(u), h) for u, h in users.items()},
    )


def _bcrypt_hash(user: str, value: Any) -> bytes:
    """The hash as bcrypt checks it, or _Refuse naming the user: malformed, or too costly."""
    where = f"basic_auth_users.{user}"
    form = BCRYPT_HASH.fullmatch(value) if isinstance(value, str) else None
    if form is None:
        raise _Refuse(
            f"{where} must be a bcrypt hash: $2y$, $2b$ or $2a$, a two-digit cost, $, 53 characters"
        )
    cost = int(form[1])
    if not 4 <= cost <= MAX_BCRYPT_COST:
        raise _Refuse(
            f"{where}: bcrypt cost {cost} is outside 4..{MAX_BCRYPT_COST}; every wrong password would "
            f"cost 2^{cost} rounds of the exporter's CPU. Hash it again with cost 10 to 12 "
            "(htpasswd -nBC 10 USER)"
        )
    hashed = ("$2b$" + form[0][4:]).encode()  # $2y$ (htpasswd), $2a$: $2b$ up to 72 bytes of password
    try:  # the salt and digest must decode: checked at the cheapest cost, not at the hash's own
        bcrypt.checkpw(b"", hashed[:4] + b"04" + hashed[6:])
    except ValueError:
        raise _Refuse(f"{where} is not a bcrypt hash: its salt or digest does not decode") from None
    return hashed


def decoy_hash(users: Mapping[str, bytes]) -> bytes:
    """A hash no password matches, at the users' cost (the highest where they differ)."""
    cost = max((int(h[4:6]) for h in users.values()), default=4)
    return f"$2b${cost:02d}$".encode() + b"." * 53


def ssl_context(cfg: WebConfig) -> ssl.SSLContext | None:
    """The server context with every tls_server_config key applied; None without TLS."""
    if cfg.cert_file is None or cfg.key_file is None:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    except (OSError, ssl.SSLError) as err:
        raise _Refuse(f"tls_server_config cert_file/key_file: {err}") from None
    ctx.minimum_version = TLS_VERSIONS[cfg.min_version]
    if cfg.max_version is not None:
        ctx.maximum_version = TLS_VERSIONS[cfg.max_version]
    if cfg.cipher_suites:
        try:
            ctx.set_ciphers(":".join(CIPHER_SUITES[s] for s in cfg.cipher_suites))
        except ssl.SSLError as err:
            raise _Refuse(
                f"tls_server_config.cipher_suites: this OpenSSL offers none of them ({err})"
            ) from None
    if cfg.curve is not None:
        ctx.set_ecdh_curve(CURVES[cfg.curve])
    if cfg.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    # HTTP/1.1 only: HTTP/2 is a transport capability, not a security control (docs/security.md).
    ctx.set_alpn_protocols(["http/1.1"])
    if cfg.client_ca_file and cfg.client_auth_type != "NoClientCert":
        try:
            ctx.load_verify_locations(cafile=cfg.client_ca_file)
        except (OSError, ssl.SSLError) as err:
            raise _Refuse(f"tls_server_config.client_ca_file: {err}") from None
        # Optional at the handshake, which still verifies a certificate that is given:
        # a missing one becomes a counted 401 where the type requires one.
        ctx.verify_mode = ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _san_values(cert: Mapping[str, Any]) -> set[str]:
    """The certificate's SANs written as Go writes them (IPs in their short form)."""
    found = set()
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "IP Address":
            with contextlib.suppress(ValueError):
                value = str(ipaddress.ip_address(value.strip()))
        found.add(value)
    return found


def connect_state(cfg: WebConfig) -> Callable[[Any], dict[str, Any]]:
    """Per connection, after the handshake: was a verified certificate given, and may it in."""

    def state(transport: Any) -> dict[str, Any]:
        ssl_object = transport.get_extra_info("ssl_object")
        cert: dict[str, Any] | None = ssl_object.getpeercert() if ssl_object is not None else None
        allowed = bool(cert) and (
            not cfg.client_allowed_sans or bool(_san_values(cert or {}) & set(cfg.client_allowed_sans))
        )
        return {"client_cert": bool(cert), "client_allowed": allowed}

    return state


class HeadersMiddleware:
    """Adds http_server_config.headers to every answer."""

    def __init__(self, app: ASGIApp, headers: Mapping[str, str]) -> None:
        self.app = app
        self.extra = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *self.extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


class AuthMiddleware:
    """Plain ASGI middleware (no per-request task) so scrapes stay cheap."""

    def __init__(self, app: ASGIApp, cfg: WebConfig, on_failure: Callable[[str], None]) -> None:
        self.app = app
        self.cfg = cfg
        self.on_failure = on_failure
        self.decoy = decoy_hash(cfg.users)
        # digests of accepted credentials, the least recently used first
        self._verified: OrderedDict[bytes, None] = OrderedDict()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in UNPROTECTED:
            return await self.app(scope, receive, send)
        reason = self._certificate_refusal(scope) or await self._password_refusal(scope)
        if reason is None:
            return await self.app(scope, receive, send)
        self.on_failure(reason)
        headers = [(b"content-type", b"text/plain")]
        if reason not in ("client_certificate", "client_san"):
            headers.append((b"www-authenticate", b'Basic realm="llm-gpu-exporter"'))
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": b"Unauthorized\n"})

    def _certificate_refusal(self, scope: Scope) -> str | None:
        state = scope.get("state", {})
        if self.cfg.require_client_cert and not state.get("client_cert"):
            return "client_certificate"
        if self.cfg.client_allowed_sans and not state.get("client_allowed"):
            return "client_san" if state.get("client_cert") else "client_certificate"
        return None

    async def _password_refusal(self, scope: Scope) -> str | None:
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
        digest = hashlib.sha256(user + b"\0" + password + b"\0" + (hashed or b"")).digest()
        if hashed is not None and digest in self._verified:
            self._verified.move_to_end(digest)
            return None
        loop = asyncio.get_running_loop()
        matched = await loop.run_in_executor(_BCRYPT, _matches, password, hashed or self.decoy)
        if hashed is None or not matched:
            return "bad_credentials"
        self._verified[digest] = None
        if len(self._verified) > VERIFIED_KEEP:
            self._verified.popitem(last=False)
        return None


def _matches(password: bytes, hashed: bytes) -> bool:
    """bcrypt's verdict; a password over its 72 bytes matches nothing (as in Go)."""
    return len(password) <= 72 and bcrypt.checkpw(password, hashed)
