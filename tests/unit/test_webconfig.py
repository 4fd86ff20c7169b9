"""--web-config-file: every exporter-toolkit key applied, against real TLS clients, or the
file refused with the key named."""

from __future__ import annotations

import base64
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import bcrypt
import httpx
import pytest

from exporter.config import ConfigError
from exporter.web import webconfig
from exporter.web.server import create_app
from tests.support.tls_pki import live_server, make_pki

SCENARIO = """
gpus: {count: 1, model: H100-80GB-SXM}
phases: [{name: p, duration: 100, gpu: {util: 0.5}}]
"""
TLS = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
MTLS = TLS + "  client_ca_file: ca.crt\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    make_pki(
        d,
        {
            "server": "IP:127.0.0.1",
            "client": "DNS:prometheus.example,IP:10.0.0.7",
            "stranger": "DNS:someone.else",
        },
    )
    return d


def _load(pki: Path, text: str) -> webconfig.WebConfig:
    path = pki / "web.yml"
    path.write_text(text)
    return webconfig.load(str(path))


@pytest.fixture
def serve(sim, pki: Path) -> Iterator[object]:  # type: ignore[no-untyped-def]
    """serve(web config text) -> (base URL, runner) of a live server using it."""
    stack: list[object] = []

    def start(text: str) -> tuple[str, object]:
        web = _load(pki, text)
        s = sim(SCENARIO)
        s.at(1)
        ctx = live_server(create_app(s.runner, web), web)
        port, _ = ctx.__enter__()
        stack.append(ctx)
        scheme = "https" if web.tls else "http"
        return f"{scheme}://127.0.0.1:{port}", s.runner

    yield start
    for ctx in reversed(stack):
        ctx.__exit__(None, None, None)  # type: ignore[attr-defined]


def client(pki: Path, cert: str | None = None, **versions: ssl.TLSVersion) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    for attr, value in versions.items():
        setattr(ctx, attr, value)
    if cert:
        ctx.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    return ctx


@pytest.mark.slow
def test_min_version_tls13_refuses_a_tls12_client(serve, pki: Path) -> None:  # type: ignore[no-untyped-def]
    base, _ = serve(TLS + "  min_version: TLS13\n")
    tls12 = client(pki, maximum_version=ssl.TLSVersion.TLSv1_2)
    with pytest.raises(httpx.ConnectError):
        httpx.get(base + "/healthz", verify=tls12)
    assert httpx.get(base + "/healthz", verify=client(pki)).status_code == 200


def test_max_version_tls12_refuses_a_tls13_only_client(serve, pki: Path) -> None:  # type: ignore[no-untyped-def]
    base, _ = serve(TLS + "  max_version: TLS12\n")
    with pytest.raises(httpx.ConnectError):
        httpx.get(base + "/healthz", verify=client(pki, minimum_version=ssl.TLSVersion.TLSv1_3))
    assert httpx.get(base + "/healthz", verify=client(pki)).status_code == 200


def test_default_min_version_is_tls12(pki: Path) -> None:
    ctx = webconfig.ssl_context(_load(pki, TLS))
    assert ctx is not None and ctx.minimum_version == ssl.TLSVersion.TLSv1_2


def test_cipher_suites_are_what_a_tls12_client_gets(serve, pki: Path) -> None:  # type: ignore[no-untyped-def]
    base, _ = serve(TLS + "  max_version: TLS12\n  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384]\n")
    other = client(pki)
    other.set_ciphers("ECDHE-RSA-AES128-GCM-SHA256")
    with pytest.raises(httpx.ConnectError):
        httpx.get(base + "/healthz", verify=other)
    with httpx.Client(verify=client(pki)) as c:
        assert c.get(base + "/healthz").status_code == 200
        stream = c.get(base + "/healthz").extensions["network_stream"]
        assert stream.get_extra_info("ssl_object").cipher()[0] == "ECDHE-RSA-AES256-GCM-SHA384"


def test_curve_preference_restricts_the_key_exchange(serve, pki: Path) -> None:  # type: ignore[no-untyped-def]
    base, _ = serve(TLS + "  curve_preferences: [CurveP384]\n")
    p256 = client(pki)
    p256.set_ecdh_curve("prime256v1")
    with pytest.raises(httpx.ConnectError):
        httpx.get(base + "/healthz", verify=p256)
    p384 = client(pki)
    p384.set_ecdh_curve("secp384r1")
    assert httpx.get(base + "/healthz", verify=p384).status_code == 200


def test_client_allowed_sans(serve, pki: Path) -> None:  # type: ignore[no-untyped-def]
    base, runner = serve(
        MTLS + "  client_auth_type: RequireAndVerifyClientCert\n  client_allowed_sans: [10.0.0.7]\n"
    )
    assert httpx.get(base + "/metrics", verify=client(pki, "client")).status_code == 200  # IP SAN
    assert httpx.get(base + "/metrics", verify=client(pki, "stranger")).status_code == 401
    assert httpx.get(base + "/metrics", verify=client(pki)).status_code == 401
    assert runner.stats.auth_failures["client_san"] == 1
    assert runner.stats.auth_failures["client_certificate"] == 1


def test_verify_if_given_lets_a_client_without_a_certificate_in(serve, pki: Path) -> None:  # type: ignore[no-untyped-def]
    base, _ = serve(MTLS + "  client_auth_type: VerifyClientCertIfGiven\n")
    assert httpx.get(base + "/metrics", verify=client(pki)).status_code == 200
    assert httpx.get(base + "/metrics", verify=client(pki, "client")).status_code == 200


def test_a_certificate_from_another_ca_fails_the_handshake(serve, pki: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    base, _ = serve(MTLS + "  client_auth_type: RequireAndVerifyClientCert\n")
    make_pki(tmp_path, {"client": "DNS:prometheus.example"})  # same names, another CA
    foreign = client(pki)
    foreign.load_cert_chain(str(tmp_path / "client.crt"), str(tmp_path / "client.key"))
    with pytest.raises(httpx.TransportError):
        httpx.get(base + "/metrics", verify=foreign)


def test_headers_on_every_answer(serve, pki: Path) -> None:  # type: ignore[no-untyped-def]
    hashed = "$2y$04$" + "." * 53  # no password matches: every /metrics is a 401
    base, _ = serve(
        TLS + "http_server_config:\n  headers:\n    Strict-Transport-Security: max-age=31536000\n"
        "    X-Frame-Options: deny\n  http2: false\n"
        f"basic_auth_users:\n  alice: '{hashed}'\n"
    )
    for path, status in (("/healthz", 200), ("/metrics", 401)):
        r = httpx.get(base + path, verify=client(pki))
        assert r.status_code == status
        assert r.headers["strict-transport-security"] == "max-age=31536000"
        assert r.headers["x-frame-options"] == "deny"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("surprise: 1\n", "unknown key the file.surprise"),
        (TLS + "  prefer_tls: true\n", "unknown key tls_server_config.prefer_tls"),
        ("http_server_config:\n  keep_alive: false\n", "unknown key http_server_config.keep_alive"),
        (TLS + "  cert: '-----BEGIN'\n", "tls_server_config.cert .inline PEM. is not supported"),
        (TLS + "  min_version: TLS14\n", "min_version must be one of"),
        (TLS + "  min_version: TLS13\n  max_version: TLS12\n", "max_version TLS12 is below min_version"),
        (TLS + "  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n", "unsupported suite TLS_RSA_WITH_RC4_128_SHA"),
        (TLS + "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n", "TLS 1.3 suite"),
        (
            TLS + "  min_version: TLS13\n  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n",
            "but min_version is TLS13",
        ),
        (TLS + "  curve_preferences: [CurveP256, X25519]\n", "give one curve"),
        (TLS + "  curve_preferences: [P256]\n", "unknown curve P256"),
        (TLS + "  client_auth_type: Sometimes\n", "client_auth_type must be one of"),
        (TLS + "  client_auth_type: RequireAndVerifyClientCert\n", "needs client_ca_file"),
        (
            MTLS + "  client_auth_type: RequireAnyClientCert\n  client_allowed_sans: [x]\n",
            "client_allowed_sans needs client_auth_type",
        ),
        ("tls_server_config:\n  min_version: TLS13\n", "sets min_version but no cert_file"),
        ("tls_server_config:\n  cert_file: a.crt\n", "both cert_file and key_file"),
        ("tls_server_config: {cert_file: nope.crt, key_file: nope.key}\n", "cert_file/key_file"),
        ("http_server_config:\n  headers: {Server: x}\n", "Server can not be configured"),
        ("http_server_config:\n  headers: {X-Frame-Options: allow}\n", "X-Frame-Options must be one of"),
        ("http_server_config:\n  http2: maybe\n", "http2 must be true or false"),
        ("basic_auth_users:\n  alice: plain\n", "bcrypt hash"),
        ("basic_auth_users:\n  alice: $2b$10$abc\n", "basic_auth_users.alice must be a bcrypt hash"),
        ("basic_auth_users:\n  alice: 12\n", "basic_auth_users.alice must be a bcrypt hash"),
        (
            f"basic_auth_users:\n  bob: $2b$31${'.' * 53}\n",
            "basic_auth_users.bob: bcrypt cost 31 is outside 4..14",
        ),
        (f"basic_auth_users:\n  bob: $2b$15${'.' * 53}\n", "basic_auth_users.bob: bcrypt cost 15"),
        (f"basic_auth_users:\n  bob: $2b$03${'.' * 53}\n", "basic_auth_users.bob: bcrypt cost 3 "),
        (f"basic_auth_users:\n  carol: $2y$10${'a' * 53}\n", "carol is not a bcrypt hash: its salt"),
        (TLS + "  min_version: TLS10\n", "min_version TLS10 cannot be honoured"),
        (TLS + "  min_version: TLS11\n", "min_version TLS11 cannot be honoured"),
        (TLS + "  max_version: TLS11\n", "max_version TLS11 cannot be honoured"),
    ],
)
def test_a_key_that_cannot_be_applied_is_refused_by_name(pki: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(pki, text)


def test_every_client_auth_type_loads(pki: Path) -> None:
    for auth in webconfig.CLIENT_AUTH_TYPES:
        cfg = _load(pki, MTLS + f"  client_auth_type: {auth}\n")
        ctx = webconfig.ssl_context(cfg)
        assert ctx is not None
        expected = ssl.CERT_NONE if auth == "NoClientCert" else ssl.CERT_OPTIONAL
        assert ctx.verify_mode == expected, auth


# ---- basic auth: bcrypt off the event loop, the same cost for every refusal --------------

FLOOD = r"""
import asyncio, base64, sys

port, clients = int(sys.argv[1]), int(sys.argv[2])
auth = base64.b64encode(b"alice:wrong").decode()
request = f"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\nauthorization: Basic {auth}\r\n\r\n"


async def client():
    while True:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request.encode())
            await reader.read()
            writer.close()
        except OSError:
            await asyncio.sleep(0.05)


async def main():
    await asyncio.gather(*(client() for _ in range(clients)))


asyncio.run(main())
"""


def _seconds(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _basic(user: str, password: str) -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.mark.slow
def test_wrong_passwords_from_150_clients_do_not_stall_the_server(serve) -> None:  # type: ignore[no-untyped-def]
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(10)).decode()
    base, runner = serve(f"basic_auth_users:\n  alice: '{hashed}'\n")
    one_check = sorted(_seconds(lambda: bcrypt.checkpw(b"wrong", hashed.encode())) for _ in range(3))[1]
    port = base.rsplit(":", 1)[1]
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, port, "150"])
    try:
        with httpx.Client(timeout=30) as c:
            deadline = time.monotonic() + 30
            while runner.stats.auth_failures["bad_credentials"] < 10 and time.monotonic() < deadline:
                time.sleep(0.1)
            before = runner.stats.auth_failures["bad_credentials"]
            during = []
            for _ in range(20):
                during.append(_seconds(lambda: c.get(base + "/healthz").raise_for_status()))
                time.sleep(0.05)
            checked = runner.stats.auth_failures["bad_credentials"] - before
            # the right password, while the flood goes on: one check (it waits its turn), then remembered
            assert c.get(base + "/metrics", headers=_basic("alice", "right")).status_code == 200
            again = _seconds(lambda: c.get(base + "/metrics", headers=_basic("alice", "right")))
    finally:
        flood.kill()
        flood.wait()
    during.sort()
    assert checked >= 3, "the flood was checking passwords all along"
    median, p90 = during[len(during) // 2], during[int(len(during) * 0.9)]
    assert median < 0.05 and p90 < one_check, (median, p90, one_check)
    assert again < one_check, (again, one_check)


def test_an_unknown_user_costs_what_a_known_one_does(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(8)).decode()
    base, _ = serve(f"basic_auth_users:\n  alice: '{hashed}'\n")
    checked: list[bytes] = []
    real = bcrypt.checkpw

    def counted(password: bytes, against: bytes) -> bool:
        checked.append(against)
        return real(password, against)

    monkeypatch.setattr(bcrypt, "checkpw", counted)
    with httpx.Client(timeout=30) as c:

        def median(user: str) -> float:
            times = []
            for _ in range(7):
                started = time.perf_counter()
                assert c.get(base + "/metrics", headers=_basic(user, "wrong")).status_code == 401
                times.append(time.perf_counter() - started)
            return sorted(times)[3]

        known, unknown = median("alice"), median("mallory")
    assert len(checked) == 14 and {h[:7] for h in checked} == {b"$2b$08$"}  # one check each, one cost
    assert 0.5 < unknown / known < 2.0, (unknown, known)


def test_a_password_past_bcrypts_72_bytes_is_refused_not_an_error(serve) -> None:  # type: ignore[no-untyped-def]
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(4)).decode()
    base, runner = serve(f"basic_auth_users:\n  alice: '{hashed}'\n")
    got = httpx.get(base + "/metrics", headers=_basic("alice", "right" + "x" * 100))
    assert got.status_code == 401 and runner.stats.auth_failures["bad_credentials"] == 1
