"""Abusive clients and hostile pages against the served exporter, before and after.

    python bench/hardening.py --before REF [--sections clients pages tls auth storm labels]
        [--gpus 8 72] [--non-readers 1000] [--idle 20000] [--bomb-mib 256]

Each version (the tree at REF, extracted with `git archive`, then this checkout) is
started as `llm-gpu-exporter serve` on a simulated node on loopback, and each section
prints one Markdown table, a column per version:

- clients (per GPU count): RSS and scrapes, idle, with `--non-readers` connections that
  send `GET /metrics` and never read (4 KiB receive buffer), and with `--idle`
  connections that send nothing (from child processes: 20 000 files per process here);
- pages: two engine targets on loopback servers that answer a `gzip, gzip` page and a
  gzip page, each inflating to `--bomb-mib` MiB; the exporter's peak RSS and its
  slowest /metrics over 10 s;
- tls: 1 000 TCP connections to the https port that never start their handshake; RSS
  with them open, how many the server closed by the handshake deadline, and RSS after;
- auth: basic auth (bcrypt cost 10): /healthz while 150 clients send wrong passwords;
  a known and an unknown user's refusal times; start-up with a malformed and a cost-31
  hash;
- storm: 3 000 clients (child processes) that reconnect as soon as they are let go,
  against the default 1 024 connections; the share of 100 scrapes that fail;
- labels: an engine page naming 18 000 models (under the 20 000-sample cap: size and
  time of our /metrics), two engines behind one host:port (series written twice),
  `min_version: TLS10`, and a request with a 100 KB header.

Every loop is bounded and every socket is closed at the end; nothing leaves loopback.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import os
import select
import socket
import statistics
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BytesIO
from pathlib import Path

import bcrypt
import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = {
    "accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    "accept-encoding": "gzip",
}
SCENARIO = (
    "gpus: {{count: {n}, model: H100-80GB-SXM}}\nphases: [{{name: p, duration: 36000, gpu: {{util: 0.5}}}}]\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int, key: str = "VmRSS") -> float:
    """VmRSS (or VmHWM, the peak) of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no {key}")


def scrape(url: str, timeout: float = 10.0) -> float | None:
    """Seconds for one Prometheus-style scrape; None when it timed out or failed."""
    with httpx.Client(timeout=timeout, verify=False) as client:  # made before the clock starts
        started = time.perf_counter()
        try:
            client.get(url, headers=PROMETHEUS).raise_for_status()
        except httpx.HTTPError:
            return None
        return time.perf_counter() - started


def show(seconds: float | None) -> str:
    return "failed (10 s timeout)" if seconds is None else f"{seconds * 1000:.0f} ms"


def serve_command(src: Path, scenario: Path, port: int, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "exporter.cli", "serve", "--scenario-file", str(scenario)]
    return [*cmd, "--listen", f"127.0.0.1:{port}", "--no-discover-processes", *extra]


@contextlib.contextmanager
def served(
    src: Path, scenario: Path, *extra: str, scheme: str = "http", auth: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.Popen(
        serve_command(src, scenario, port, *extra),
        cwd=src,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"{scheme}://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/readyz", timeout=10, verify=False, headers=auth).status_code == 200:
                    break
            if proc.poll() is not None:
                raise RuntimeError(f"{src}: serve exited {proc.returncode}")
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{src}: not ready in 90 s")
        time.sleep(3)  # a few cycles: steady state
        yield proc, base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _reset_on_close(s: socket.socket) -> None:
    # RST instead of FIN: no TIME_WAIT, so the next phase has its ports back
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def non_readers(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        _reset_on_close(s)
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nhost: bench\r\naccept-encoding: identity\r\n\r\n")
        except OSError:
            s.close()
            continue
        socks.append(s)
    return socks


def idle_connections(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.socket()
        _reset_on_close(s)
        s.setblocking(False)
        if s.connect_ex(("127.0.0.1", port)) not in (0, 115):  # 115: EINPROGRESS
            s.close()
            continue
        socks.append(s)
    return socks


def _opened(socks: list[socket.socket], asked: int) -> str:
    return "" if len(socks) == asked else f" ({len(socks)} connected)"


HOLD_PER_PROCESS = 15000  # under this machine's 20 000 open files per process


@contextlib.contextmanager
def holders(port: int, count: int) -> Iterator[int]:
    """`count` idle connections, held by child processes (one process has too few files)."""
    procs = []
    for start in range(0, count, HOLD_PER_PROCESS):
        n = min(HOLD_PER_PROCESS, count - start)
        cmd = [sys.executable, __file__, "--hold", str(port), str(n)]
        procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    try:
        yield sum(int(p.stdout.readline() or 0) for p in procs if p.stdout is not None)
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                p.communicate(timeout=60)  # closing stdin tells it to close its sockets


def hold(port: int, count: int) -> int:
    socks = idle_connections(port, count)
    print(len(socks), flush=True)
    sys.stdin.read()  # until the parent closes the pipe
    close_all(socks)
    return 0


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


def measure(src: Path, scenario: Path, args: argparse.Namespace) -> dict[str, str]:
    out: dict[str, str] = {}
    with served(src, scenario) as (proc, base):
        port = int(base.rsplit(":", 1)[1])
        url = base + "/metrics"
        idle = [scrape(url) for _ in range(5)]
        out["idle RSS"] = f"{rss_mb(proc.pid):.0f} MB"
        out["idle scrape (median of 5)"] = show(sorted(s for s in idle if s is not None)[2])

        socks = non_readers(port, args.non_readers)
        time.sleep(4)
        during = [scrape(url) for _ in range(3)]
        out[f"RSS, {args.non_readers} non-reading clients"] = f"{rss_mb(proc.pid):.0f} MB" + _opened(
            socks, args.non_readers
        )
        out["scrape meanwhile (worst of 3)"] = show(None if None in during else max(during))  # type: ignore[type-var]
        close_all(socks)
        time.sleep(3)

        with holders(port, args.idle) as opened:
            time.sleep(3)
            note = "" if opened == args.idle else f" ({opened} connected)"
            out[f"scrape with {args.idle} idle connections open"] = show(scrape(url)) + note
        time.sleep(2)
        out["RSS at the end"] = f"{rss_mb(proc.pid):.0f} MB"
    return out


def median(values: list[float]) -> float:
    return statistics.median(values)


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 0.1 else f"{seconds * 1000:.0f} ms"


def metric_values(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    }


def startup(src: Path, scenario: Path, *extra: str, probe: Callable[[str], str] | None = None) -> str:
    """What `serve` does with these flags: refuses to start (and says why), or starts,
    and then what `probe(base URL)` reports."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.Popen(
        serve_command(src, scenario, port, *extra),
        cwd=src,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(base + "/healthz", timeout=1, verify=False)
                break
            time.sleep(0.3)
        if proc.poll() is not None:
            why = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
            said = why[-1].split(".yml: ", 1)[-1].split(";")[0] if why else ""  # the key and the reason
            return f"refused at start (exit {proc.returncode}): {said}"
        return "starts; " + (probe(base) if probe else "serves")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()  # a server frozen in bcrypt does not see SIGTERM
            proc.wait()


# ---- hostile engine pages --------------------------------------------------------------


def gzip_zeros(mib: int) -> bytes:
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    return b"".join([*(z.compress(block) for _ in range(mib)), z.flush()])


class PageServer:
    """A loopback HTTP server: path -> (Content-Encoding or None, body)."""

    def __init__(self, pages: dict[str, tuple[str | None, bytes]]) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                encoding, body = pages.get(self.path, (None, b""))
                self.send_response(200 if self.path in pages else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                if encoding:
                    self.send_header("Content-Encoding", encoding)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            # The exporter hangs up on a page it refuses: that is the point, not an error.
            def handle_error(self, request: object, client_address: object) -> None:
                pass

        self.httpd = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str = "/metrics") -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def pages_section(src: Path, scenario: Path, args: argparse.Namespace, _: Path) -> dict[str, str]:
    inner = gzip_zeros(args.bomb_mib)
    stacked = PageServer({"/metrics": ("gzip, gzip", gzip.compress(inner))})
    single = PageServer({"/metrics": ("gzip", inner)})
    out = {"pages": f"{len(gzip.compress(inner))} B `gzip, gzip` and {len(inner) // 1000} KB gzip, "}
    out["pages"] += f"each {args.bomb_mib} MiB inflated"
    extra = ("--engine", stacked.url(), "--engine", single.url(), "--engine-interval", "1")
    try:
        with served(src, scenario, *extra) as (proc, base):
            out["RSS when ready (the pages scraped already)"] = f"{rss_mb(proc.pid):.0f} MB"
            Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # VmHWM from now on
            worst, text = 0.0, ""
            stop = time.monotonic() + 10
            with httpx.Client(timeout=30) as client:
                while time.monotonic() < stop:
                    started = time.perf_counter()
                    got = client.get(base + "/metrics")
                    worst = max(worst, time.perf_counter() - started)
                    text = got.text
                    time.sleep(0.2)
            out["peak RSS over the next 10 s (VmHWM)"] = f"{rss_mb(proc.pid, 'VmHWM'):.0f} MB"
            out["slowest /metrics meanwhile"] = ms(worst)
            errors = metric_values(text, "llmgpu_engine_scrape_errors_total")
            for name, server in (("`gzip, gzip`", stacked), ("gzip", single)):
                target = server.url().split("//")[1].split("/")[0]
                seen = {dict(k)["reason"]: int(v) for k, v in errors.items() if dict(k)["target"] == target}
                out[f"scrape errors, {name} target"] = ", ".join(f"{r} {n}" for r, n in seen.items() if n)
    finally:
        stacked.stop()
        single.stop()
    return out


# ---- TLS handshakes that never start ---------------------------------------------------


def tls_config(tmp: Path) -> Path:
    key, cert = tmp / "bench.key", tmp / "bench.crt"
    if not cert.exists():
        subprocess.run(
            [
                *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
                *("-subj", "/CN=bench", "-addext", "subjectAltName=IP:127.0.0.1"),
                *("-keyout", str(key), "-out", str(cert)),
            ],
            check=True,
            capture_output=True,
        )
    web = tmp / "tls.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    return web


def closed_by_server(socks: list[socket.socket]) -> int:
    closed = 0
    for s in socks:
        if select.select([s], [], [], 0)[0]:
            try:
                closed += s.recv(1) == b""
            except OSError:
                closed += 1
    return closed


def tls_section(src: Path, scenario: Path, args: argparse.Namespace, tmp: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    extra = ("--web-config-file", str(tls_config(tmp)), "--header-timeout", "5")
    with served(src, scenario, *extra, scheme="https") as (proc, base):
        port = int(base.rsplit(":", 1)[1])
        out["idle RSS"] = f"{rss_mb(proc.pid):.0f} MB"
        socks = idle_connections(port, 1000)
        time.sleep(2)
        out["RSS, 1000 silent TCP connections to the TLS port"] = f"{rss_mb(proc.pid):.0f} MB" + _opened(
            socks, 1000
        )
        out["TLS scrape meanwhile"] = show(scrape(base + "/metrics"))
        time.sleep(6)  # past the 5 s handshake deadline
        out["closed by the server within 8 s"] = f"{closed_by_server(socks)} of {len(socks)}"
        close_all(socks)
        time.sleep(2)
        out["RSS after they are gone"] = f"{rss_mb(proc.pid):.0f} MB"
    return out


# ---- basic auth ----------------------------------------------------------------------


def basic(user: str, password: str) -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def flood(port: int, clients: int) -> int:
    """`clients` connections that each send a wrong password, again and again."""
    import asyncio

    request = (
        "GET /metrics HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n"
        f"authorization: {basic('alice', 'wrong')['authorization']}\r\n\r\n"
    ).encode()

    async def client() -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request)
                await reader.read()
                writer.close()
            except OSError:
                await asyncio.sleep(0.05)

    async def run() -> None:
        await asyncio.gather(*(client() for _ in range(clients)))

    asyncio.run(run())
    return 0


def auth_section(src: Path, scenario: Path, args: argparse.Namespace, tmp: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    web = tmp / "auth.yml"
    web.write_text(f"basic_auth_users:\n  alice: '{bcrypt.hashpw(b'right', bcrypt.gensalt(10)).decode()}'\n")
    right = basic("alice", "right")
    with (
        served(src, scenario, "--web-config-file", str(web), auth=right) as (_, base),
        httpx.Client(timeout=60) as c,
    ):
        quiet = median([timed(lambda: c.get(base + "/healthz")) for _ in range(10)])
        known = median(
            [timed(lambda: c.get(base + "/metrics", headers=basic("alice", "x"))) for _ in range(10)]
        )
        unknown = median(
            [timed(lambda: c.get(base + "/metrics", headers=basic("bob", "x"))) for _ in range(10)]
        )
        port = base.rsplit(":", 1)[1]
        clients = subprocess.Popen([sys.executable, __file__, "--flood", port, "150"])
        try:
            time.sleep(3)
            during = [timed(lambda: c.get(base + "/healthz")) for _ in range(10)]
        finally:
            clients.kill()
            clients.wait()
    out["/healthz, quiet (median of 10)"] = ms(quiet)
    out["/healthz, 150 clients sending wrong passwords (median / worst of 10)"] = (
        f"{ms(median(during))} / {ms(max(during))}"
    )
    out["a refusal: known user / unknown user (median of 10)"] = f"{ms(known)} / {ms(unknown)}"

    def wrong_password(base: str) -> str:
        try:
            got = httpx.get(base + "/metrics", headers=basic("alice", "x"), timeout=5)
            return f"a wrong password is answered {got.status_code}"
        except httpx.TimeoutException:
            return "a wrong password gets no answer in 5 s (the server is frozen)"

    for label, hashed in (("`$2b$10$abc`", "$2b$10$abc"), ("a cost-31 hash", "$2b$31$" + "." * 53)):
        web.write_text(f"basic_auth_users:\n  alice: '{hashed}'\n")
        out[f"start-up with {label}"] = startup(
            src, scenario, "--web-config-file", str(web), probe=wrong_password
        )
    return out


# ---- a reconnect storm ---------------------------------------------------------------


def storm(port: int, clients: int) -> int:
    """`clients` connections that say nothing and come back as soon as they are let go."""
    import asyncio

    async def client() -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                await reader.read()
                writer.close()
            except OSError:
                pass
            await asyncio.sleep(0.02)

    async def run() -> None:
        await asyncio.gather(*(client() for _ in range(clients)))

    asyncio.run(run())
    return 0


def storm_section(src: Path, scenario: Path, args: argparse.Namespace, _: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    with served(src, scenario) as (_, base):
        port = base.rsplit(":", 1)[1]
        procs = [subprocess.Popen([sys.executable, __file__, "--storm", port, "1000"]) for _ in range(3)]
        try:
            time.sleep(5)
            times: list[float] = []
            failed = 0
            stop = time.monotonic() + 90
            for _ in range(100):
                if time.monotonic() > stop:
                    break
                took = scrape(base + "/metrics", timeout=10)
                failed += took is None
                times += [took] if took is not None else []
                time.sleep(0.05)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    tried = failed + len(times)
    out["scrapes failed, 3000 clients reconnecting (1024 connections)"] = f"{failed} of {tried}"
    out["median of those answered"] = ms(median(times)) if times else "-"
    return out


# ---- labels, TLS versions, the header cap --------------------------------------------

GOOD_PAGE = ROOT / "tests" / "fixtures" / "vllm" / "vllm-0.32-cpu-loaded.txt"


def scrape_text(base: str) -> tuple[str, float]:
    """The plain /metrics once every engine target is up, and the median of 5 scrapes."""
    with httpx.Client(timeout=30) as client:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ups = metric_values(client.get(base + "/metrics").text, "llmgpu_engine_up").values()
            if ups and all(ups):
                break
            time.sleep(0.5)
        times, text = [], ""
        for _ in range(5):
            started = time.perf_counter()
            text = client.get(base + "/metrics", headers={"accept-encoding": "identity"}).text
            times.append(time.perf_counter() - started)
    return text, median(times)


def labels_section(src: Path, scenario: Path, args: argparse.Namespace, tmp: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    good = GOOD_PAGE.read_bytes()
    models = "".join(f'vllm:num_requests_running{{model_name="m{i:05d}"}} 1\n' for i in range(18_000))
    pages = PageServer(
        {"/metrics": (None, good), "/b/metrics": (None, good), "/many": (None, good + models.encode())}
    )
    try:
        with served(src, scenario, "--engine", "vllm=" + pages.url()) as (_, base):
            text, took = scrape_text(base)
            out["/metrics, one engine"] = f"{len(text) // 1000} KB, {ms(took)}"
            sock = socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=5)
            with contextlib.suppress(OSError):
                sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: b\r\nx-big: " + b"a" * 100_000 + b"\r\n\r\n")
            try:
                line = sock.recv(4096).split(b"\r\n")[0].decode() or "closed"
            except OSError:
                line = "reset"
            sock.close()
            out["a request with a 100 KB header"] = line
        with served(src, scenario, "--engine", "vllm=" + pages.url("/many")) as (_, base):
            text, took = scrape_text(base)
            out["/metrics, that engine naming 18 000 more models"] = f"{len(text) // 1000} KB, {ms(took)}"
        two = ("--engine", "vllm=" + pages.url(), "--engine", "vllm=" + pages.url("/b/metrics"))
        with served(src, scenario, *two) as (_, base):
            text, _ = scrape_text(base)
            samples = [
                (s.name, tuple(sorted(s.labels.items())))
                for fam in text_string_to_metric_families(text)
                for s in fam.samples
            ]
            out["two engines behind one host:port: series written twice"] = str(
                len(samples) - len(set(samples))
            )
    finally:
        pages.stop()
    web = tls_config(tmp)
    web.write_text(web.read_text() + "  min_version: TLS10\n")
    out["`min_version: TLS10`"] = startup(src, scenario, "--web-config-file", str(web))
    return out


SECTIONS: dict[str, Callable[[Path, Path, argparse.Namespace, Path], dict[str, str]]] = {
    "pages": pages_section,
    "tls": tls_section,
    "auth": auth_section,
    "storm": storm_section,
    "labels": labels_section,
}


def table(rows: dict[str, dict[str, str]]) -> None:
    columns = list(dict.fromkeys(c for values in rows.values() for c in values))
    print("| | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for key, values in rows.items():
        print(f"| {key} | " + " | ".join(values.get(c, "") for c in columns) + " |")
    print(flush=True)


def extract(ref: str, into: Path) -> Path:
    tar = subprocess.run(
        ["git", "archive", ref, "exporter"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(tar)) as t:
        t.extractall(into, filter="data")
    return into


def main() -> int:
    modes = {"--hold": hold, "--flood": flood, "--storm": storm}
    if sys.argv[1:2] and sys.argv[1] in modes:
        return modes[sys.argv[1]](int(sys.argv[2]), int(sys.argv[3]))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="git ref of the version to compare with")
    p.add_argument("--sections", nargs="+", default=["clients", *SECTIONS], choices=["clients", *SECTIONS])
    p.add_argument("--gpus", type=int, nargs="+", default=[8, 72])
    p.add_argument("--non-readers", type=int, default=1000)
    p.add_argument("--idle", type=int, default=20000)
    p.add_argument("--bomb-mib", type=int, default=256, help="what each hostile page inflates to")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = extract(args.before, Path(tmp) / "before")
        trees = ((f"before ({args.before})", before), ("after", ROOT))
        if "clients" in args.sections:
            rows: dict[str, dict[str, str]] = {}
            for n in args.gpus:
                scenario = Path(tmp) / f"gpus{n}.yaml"
                scenario.write_text(SCENARIO.format(n=n))
                for name, src in trees:
                    print(f"clients, {n} GPUs, {name} ...", file=sys.stderr, flush=True)
                    for key, value in measure(src, scenario, args).items():
                        rows.setdefault(key, {})[f"{n} GPUs, {name}"] = value
            print("### clients\n")
            table(rows)
        scenario = Path(tmp) / "gpus8.yaml"
        scenario.write_text(SCENARIO.format(n=8))
        for section in [s for s in args.sections if s in SECTIONS]:
            rows = {}
            for name, src in trees:
                print(f"{section}, {name} ...", file=sys.stderr, flush=True)
                for key, value in SECTIONS[section](src, scenario, args, Path(tmp)).items():
                    rows.setdefault(key, {})[name] = value
            print(f"### {section} (8 GPUs)\n")
            table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
