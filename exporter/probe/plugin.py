"""The vLLM general plugin: a daemon thread per process that reports allocator state.

vLLM calls ``register()`` in every process it starts (API server, engine core,
workers). The probe is inert unless ``LLMGPU_PROBE_DIR`` is set or the default directory
``/run/llm-gpu-exporter/probes`` exists, so installing this package next to vLLM changes
nothing by default.

When active, a daemon thread writes ``probe-<ns>-<pid>.json`` into the directory, every
``LLMGPU_PROBE_INTERVAL`` seconds (default 15, at least 5: the allocator snapshot holds
the allocator lock while it runs). It never creates a CUDA context: it only looks at
``torch`` when the process has already imported it (``sys.modules``), and only samples
the allocator once ``torch.cuda.is_initialized()``. Until then, and in processes whose
torch has no CUDA at all, the file is a heartbeat that says so.

Anything that goes wrong inside the probe is logged once and stops the probe; vLLM keeps
serving. This module imports only the standard library and its sibling modules.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from exporter.probe.fragmentation import free_block_stats, reserved_bytes_by_device
from exporter.probe.schema import ProbeReport, ProbeState, file_name

ENV_DIR = "LLMGPU_PROBE_DIR"
ENV_INTERVAL = "LLMGPU_PROBE_INTERVAL"
ENV_ENGINE_PORT = "LLMGPU_PROBE_ENGINE_PORT"
DEFAULT_DIR = "/run/llm-gpu-exporter/probes"
DEFAULT_INTERVAL_S = 15.0
MIN_INTERVAL_S = 5.0
POLL_S = 1.0  # how often a waiting probe looks for torch / a CUDA context
VLLM_DEFAULT_PORT = 8000
MAX_ERROR_CHARS = 300

# A child of vLLM's logger: vLLM configures "vllm" (handler, INFO), so these lines show up
# in the server's log with vLLM's process prefix. Outside vLLM it is a plain logger.
logger = logging.getLogger("vllm.llm_gpu_exporter_probe")

LOG_STARTED = "llm-gpu-exporter probe started"
LOG_NO_CUDA = "llm-gpu-exporter probe: torch has no CUDA here, writing heartbeats only"
LOG_STOPPED = "llm-gpu-exporter probe stopped after an error"


def announce(message: str, *args: object) -> None:
    """Log at INFO; straight to stderr where nobody configured logging yet.

    vLLM's API server loads plugins before it configures its loggers, so an INFO record
    there would be dropped, and this line is how an operator sees the probe is on.
    """
    if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
        logger.info(message, *args)
        return
    with contextlib.suppress(Exception):
        sys.stderr.write(f"INFO {message % args}\n")
        sys.stderr.flush()


@dataclass(frozen=True)
class ProbeConfig:
    directory: str
    interval_s: float
    create_directory: bool  # configured explicitly: create it if missing


def config_from_env(env: dict[str, str] | os._Environ[str]) -> ProbeConfig | None:
    """The probe's settings, or None when it must stay inert."""
    configured = env.get(ENV_DIR, "").strip()
    if configured:
        directory, create = configured, True
    elif os.path.isdir(DEFAULT_DIR):
        directory, create = DEFAULT_DIR, False
    else:
        return None
    return ProbeConfig(directory, parse_interval(env.get(ENV_INTERVAL)), create)


def parse_interval(raw: str | None) -> float:
    """Seconds between samples: the default when unset or unreadable, never below 5."""
    if raw is None or not raw.strip():
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        logger.warning("%s=%r is not a number; using %g s", ENV_INTERVAL, raw, DEFAULT_INTERVAL_S)
        return DEFAULT_INTERVAL_S
    if not value >= MIN_INTERVAL_S:  # also catches NaN
        logger.warning("%s=%r is below %g s; using %g s", ENV_INTERVAL, raw, MIN_INTERVAL_S, MIN_INTERVAL_S)
        return MIN_INTERVAL_S
    return value


def engine_port_from(argv: list[str], env: dict[str, str] | os._Environ[str]) -> int | None:
    """The engine's HTTP port: ``LLMGPU_PROBE_ENGINE_PORT``, else ``--port`` on the
    command line (spawned vLLM children inherit the parent's ``sys.argv``), else 8000
    for a ``vllm serve`` / api_server command line, else None."""
    candidates: list[str] = []
    if env.get(ENV_ENGINE_PORT, "").strip():
        candidates.append(env[ENV_ENGINE_PORT].strip())
    for i, arg in enumerate(argv):
        if arg == "--port" and i + 1 < len(argv):
            candidates.append(argv[i + 1])
        elif arg.startswith("--port="):
            candidates.append(arg.split("=", 1)[1])
    for candidate in candidates:
        try:
            port = int(candidate)
        except ValueError:
            continue
        if 0 < port < 65536:
            return port
    serving = any(a == "serve" or a.endswith(("api_server", "api_server.py")) for a in argv[:3])
    return VLLM_DEFAULT_PORT if serving else None


def rank_from(torch: ModuleType | None, env: dict[str, str] | os._Environ[str]) -> int | None:
    """torch.distributed rank when a process group exists, else RANK / LOCAL_RANK."""
    dist = sys.modules.get("torch.distributed") if torch is not None else None
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank())
        except Exception:  # a half-built group is not worth stopping the probe for
            pass
    for name in ("RANK", "LOCAL_RANK"):
        raw = env.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return None


def _process_name() -> str:
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return "MainProcess"
    try:
        return str(mp.current_process().name)
    except Exception:
        return "unknown"


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def torch_state(torch: ModuleType | None) -> str:
    """Where this process stands, without creating a CUDA context."""
    if torch is None or "torch.cuda" not in sys.modules:
        return ProbeState.WAITING_FOR_TORCH
    version = getattr(torch, "version", None)
    cuda = getattr(torch, "cuda", None)
    if version is None or cuda is None or not hasattr(cuda, "is_initialized"):
        return ProbeState.WAITING_FOR_TORCH  # torch is still importing
    if getattr(version, "cuda", None) is None and getattr(version, "hip", None) is None:
        return ProbeState.NO_CUDA
    if not cuda.is_initialized():
        return ProbeState.CUDA_NOT_INITIALIZED
    return ProbeState.SAMPLING


def _normalize_uuid(raw: str) -> str:
    text = raw.strip()
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def sample_allocator(torch: ModuleType) -> dict[str, Any]:
    """ProbeReport fields read from an initialized CUDA allocator in this process."""
    cuda = torch.cuda
    started = time.perf_counter()
    try:
        segments = cuda.memory_snapshot(include_traces=False)
    except TypeError:  # torch before include_traces
        segments = cuda.memory_snapshot()
    snapshot_s = time.perf_counter() - started

    # The probe thread's current device is not the worker's: the device that holds this
    # process' memory is.
    reserved = reserved_bytes_by_device(segments)
    device = max(reserved, key=lambda d: reserved[d]) if reserved else int(cuda.current_device())
    stats: dict[str, Any] = cuda.memory_stats(device)
    free = free_block_stats(segments, device=device)

    def stat(key: str) -> int | None:
        value = stats.get(key)
        return int(value) if isinstance(value, int) else None

    uuid: str | None
    try:
        uuid = _normalize_uuid(str(cuda.get_device_properties(device).uuid))
    except Exception:
        uuid = None
    return {
        "device_index": device,
        "uuid": uuid,
        "reserved_bytes": stat("reserved_bytes.all.current"),
        "allocated_bytes": stat("allocated_bytes.all.current"),
        "requested_bytes": stat("requested_bytes.all.current"),
        "inactive_split_bytes": stat("inactive_split_bytes.all.current"),
        "alloc_retries_total": stat("num_alloc_retries"),
        "ooms_total": stat("num_ooms"),
        "device_malloc_total": stat("num_device_alloc"),
        "device_free_total": stat("num_device_free"),
        "large_free_blocks": free.free_blocks,
        "large_free_bytes": free.free_bytes,
        "largest_free_block_bytes": free.largest_free_block_bytes,
        "fragmentation_ratio": free.fragmentation_ratio,
        "fragmentation_sq_ratio": free.fragmentation_sq_ratio,
        "snapshot_duration_seconds": snapshot_s,
    }


def write_report(directory: str, report: ProbeReport) -> str:
    """Atomically replace this process' file: temp file in the same directory, rename."""
    final = os.path.join(directory, file_name(report.pid, report.pid_namespace))
    temp = os.path.join(directory, f".{os.path.basename(final)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, report.to_json())
    finally:
        os.close(fd)
    os.replace(temp, final)
    return final


class Probe:
    """The per-process probe: one daemon thread, one file."""

    def __init__(self, config: ProbeConfig) -> None:
        self.config = config
        self.pid = os.getpid()
        self.pid_namespace = _pid_namespace()
        self.hostname = socket.gethostname()
        self.engine_port = engine_port_from(list(sys.argv), os.environ)
        self.path = os.path.join(config.directory, file_name(self.pid, self.pid_namespace))
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="llmgpu-probe", daemon=True)
        self.state = ""
        self.writes = 0
        self._last_write = 0.0

    def start(self) -> None:
        if self.config.create_directory:
            os.makedirs(self.config.directory, exist_ok=True)
        announce(
            "%s in pid %d (%s): writing %s every %g s",
            LOG_STARTED,
            self.pid,
            _process_name(),
            self.path,
            self.config.interval_s,
        )
        self.thread.start()

    def stop(self, remove_file: bool = True) -> None:
        self.stop_event.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=5)
        if remove_file:
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def report(self, state: str, **values: Any) -> ProbeReport:
        torch = sys.modules.get("torch")
        return ProbeReport(
            timestamp=time.time(),
            pid=self.pid,
            state=state,
            cuda_available=state == ProbeState.SAMPLING,
            interval_seconds=self.config.interval_s,
            process_name=_process_name(),
            pid_namespace=self.pid_namespace,
            hostname=self.hostname,
            rank=rank_from(torch, os.environ),
            engine_port=self.engine_port,
            **values,
        )

    def step(self) -> float:
        """Look, write when due, return how long to sleep."""
        if self.stop_event.is_set():
            return 0.0
        torch = sys.modules.get("torch")
        state = torch_state(torch)
        changed = state != self.state
        if changed and state == ProbeState.NO_CUDA:
            announce("%s (pid %d)", LOG_NO_CUDA, self.pid)
        self.state = state
        if state == ProbeState.SAMPLING:
            assert torch is not None
            write_report(self.config.directory, self.report(state, **sample_allocator(torch)))
            self.writes += 1
            return self.config.interval_s
        due = changed or time.monotonic() - self._last_write >= self.config.interval_s
        if due:
            write_report(self.config.directory, self.report(state))
            self.writes += 1
            self._last_write = time.monotonic()
        if state == ProbeState.NO_CUDA:
            return self.config.interval_s  # torch without CUDA never gets it later
        return POLL_S

    def _run(self) -> None:
        try:
            while not self.stop_event.is_set():
                self.stop_event.wait(self.step())
        except Exception as exc:
            logger.warning("%s in pid %d: %r", LOG_STOPPED, self.pid, exc, exc_info=True)
            try:
                error = f"{exc.__class__.__name__}: {exc}"[:MAX_ERROR_CHARS]
                write_report(self.config.directory, self.report(ProbeState.FAILED, error=error))
            except Exception:
                pass


_lock = threading.Lock()
_probe: Probe | None = None
_fork_hook_installed = False
_failed_register_logged = False


def active_probe() -> Probe | None:
    """The probe running in this process, if any."""
    probe = _probe
    return probe if probe is not None and probe.pid == os.getpid() else None


def register() -> None:
    """vLLM ``general_plugins`` entry point. Idempotent, cheap, never raises."""
    global _failed_register_logged
    try:
        _register()
    except Exception as exc:
        if not _failed_register_logged:
            _failed_register_logged = True
            logger.warning("llm-gpu-exporter probe not started: %r", exc, exc_info=True)


def _register() -> None:
    global _probe, _fork_hook_installed
    with _lock:
        if active_probe() is not None:
            return
        config = config_from_env(os.environ)
        if config is None:
            logger.debug("llm-gpu-exporter probe inert: %s unset and %s absent", ENV_DIR, DEFAULT_DIR)
            return
        probe = Probe(config)
        probe.start()
        _probe = probe
        atexit.register(_remove_at_exit, probe)
        if not _fork_hook_installed and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook_installed = True


def _remove_at_exit(probe: Probe) -> None:
    """Leave no file behind on a clean exit (a killed process' file goes stale)."""
    if probe.pid == os.getpid():
        probe.stop_event.set()
        with contextlib.suppress(OSError):
            os.unlink(probe.path)


def _after_fork_in_child() -> None:
    """A forked child inherits no thread and, under vLLM, no second plugin load (its
    'plugins loaded' flag is copied too): start the child's own probe here."""
    global _lock, _probe
    _lock = threading.Lock()
    had_probe = _probe is not None
    _probe = None
    if had_probe:
        register()


def _reset_for_tests() -> None:
    """Stop and forget this process' probe (tests only)."""
    global _probe
    with _lock:
        if _probe is not None:
            _probe.stop()
        _probe = None
