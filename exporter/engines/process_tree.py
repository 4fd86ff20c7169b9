"""Engine processes on this node: which they are, their tree, their roles, their CPU.

An engine is a small process tree. vLLM: the API server, an EngineCore process per
data-parallel rank and, with tensor parallelism, one worker per GPU. SGLang: the HTTP
server, one scheduler per tensor-parallel rank. TGI: a launcher that starts the router
(HTTP) and one Python shard per GPU. The GPU attribution needs every pid of the tree
(NVML reports whichever process holds the CUDA context); the CPU ratio needs the roles.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psutil

# Command lines of the processes that serve an engine's HTTP API (and its /metrics).
SERVERS: Mapping[str, re.Pattern[str]] = {
    "vllm": re.compile(r"vllm\.entrypoints\.(?:openai\.)?api_server|(?:^|[\s/])vllm\s+serve(?:\s|$)"),
    "sglang": re.compile(r"sglang\.launch_server|(?:^|[\s/])sglang\s+serve(?:\s|$)"),
    "tgi": re.compile(r"(?:^|[\s/])text-generation-router(?:\s|$)"),
}
LAUNCHERS = re.compile(r"text-generation-launcher|(?:^|[\s/])vllm\s+serve(?:\s|$)")
DEFAULT_PORTS: Mapping[str, tuple[int, ...]] = {
    "vllm": (8000,),
    "sglang": (30000,),
    "tgi": (9000, 3000, 80),  # the Prometheus port of recent TGI first, then the API port
}
_ROLE_PATTERNS = (
    ("engine_core", re.compile(r"EngineCore|sglang::scheduler", re.IGNORECASE)),
    ("worker", re.compile(r"Worker|text-generation-server|VllmWorker", re.IGNORECASE)),
    (
        "api_server",
        re.compile(
            r"ApiServer|APIServer|api_server|text-generation-router|"
            r"sglang\.launch_server",
            re.IGNORECASE,
        ),
    ),
)
_PORT_FLAG = re.compile(r"--port[=\s]+(\d{1,5})")
_PROM_PORT_FLAG = re.compile(r"--prometheus-port[=\s]+(\d{1,5})")


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline()) or proc.name()
    except (psutil.Error, OSError):
        return ""


def engine_kind(cmdline: str) -> str | None:
    """vllm, sglang or tgi when the command line starts that engine's server."""
    for kind, pattern in SERVERS.items():
        if pattern.search(cmdline):
            return kind
    return None


def role_of(proc: psutil.Process, listener: int | None) -> str | None:
    if proc.pid == listener:
        return "api_server"
    try:
        text = f"{proc.name()} {_cmdline(proc)}"
    except (psutil.Error, OSError):
        return None
    for role, pattern in _ROLE_PATTERNS:
        if pattern.search(text):
            return role
    return None


def listening_ports(pid: int) -> list[tuple[str, int]]:
    """(address, port) of the TCP sockets the process listens on."""
    try:
        proc = psutil.Process(pid)
        conns = proc.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return []
    return sorted({(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN and c.laddr})


def listener_of(port: int) -> int | None:
    """The pid listening on a local TCP port, if this process may see it."""
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return int(c.pid)
    return None


def tree(pid: int) -> dict[int, str | None]:
    """pid -> role for the engine process tree around the serving process `pid`.

    Climbs to a launcher parent (TGI's launcher, `vllm serve` with several API servers)
    so that sibling shards and engine cores are part of the tree.
    """
    try:
        proc = psutil.Process(pid)
        root = proc
        parent = proc.parent()
        if parent is not None and LAUNCHERS.search(_cmdline(parent)):
            root = parent
        members = [root, *root.children(recursive=True)]
    except (psutil.Error, OSError):
        return {}
    return {p.pid: role_of(p, pid) for p in members}


def parse_cpulist(text: str) -> set[int]:
    """CPUs of a sysfs list such as ``0-15,32-47``."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def cpu_nodes(sys_root: str = "/sys/devices/system/node") -> dict[int, int]:
    """CPU -> NUMA node, from sysfs; empty where the kernel shows no NUMA topology."""
    out: dict[int, int] = {}
    try:
        entries = os.listdir(sys_root)
    except OSError:
        return out
    for entry in entries:
        if not (entry.startswith("node") and entry[4:].isdigit()):
            continue
        try:
            with open(os.path.join(sys_root, entry, "cpulist")) as f:
                cpus = parse_cpulist(f.read())
        except (OSError, ValueError):
            continue
        out.update(dict.fromkeys(cpus, int(entry[4:])))
    return out


def numa_nodes(
    roles: Mapping[int, str | None], nodes: Mapping[int, int] | None = None
) -> tuple[int, ...] | None:
    """NUMA nodes of the CPUs the engine's GPU-driving processes may run on.

    Workers and engine cores drive the GPUs; without them, every process with a role.
    None when no process could be read or the node map is unknown.
    """
    nodes = cpu_nodes() if nodes is None else nodes
    if not nodes:
        return None
    chosen = [p for p, r in roles.items() if r in ("worker", "engine_core")]
    chosen = chosen or [p for p, r in roles.items() if r is not None]
    found: set[int] = set()
    for pid in chosen:
        try:
            cpus = psutil.Process(pid).cpu_affinity() or []
        except (psutil.Error, OSError, AttributeError):
            continue
        found.update(nodes[c] for c in cpus if c in nodes)
    return tuple(sorted(found)) or None


def alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).is_running())
    except (psutil.Error, OSError):
        return False


@dataclass(frozen=True)
class Found:
    """An engine server process found on this node."""

    kind: str
    pid: int
    url: str


def discover(own_pid: int | None = None) -> list[Found]:
    """Engine server processes and the URL of their /metrics, from their listening port."""
    found: list[Found] = []
    seen: set[int] = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(proc.info.get("cmdline") or ())
        except (psutil.Error, OSError):
            continue
        kind = engine_kind(cmd) if cmd else None
        if kind is None or proc.pid == own_pid:
            continue
        try:
            parent = proc.parent()
        except (psutil.Error, OSError):
            parent = None
        if parent is not None and engine_kind(_cmdline(parent)) == kind:
            continue  # a child of an engine server (multi-API-server vLLM): its parent speaks
        url = _metrics_url(proc, kind, cmd)
        if url is not None and proc.pid not in seen:
            seen.add(proc.pid)
            found.append(Found(kind=kind, pid=proc.pid, url=url))
    return found


def _metrics_url(proc: psutil.Process, kind: str, cmd: str) -> str | None:
    ports = listening_ports(proc.pid)
    if not ports:
        try:
            for child in proc.children():
                ports.extend(listening_ports(child.pid))
        except (psutil.Error, OSError):
            pass
    if not ports:
        return None
    by_port = {port: ip for ip, port in ports}
    flagged = [int(p) for p in (*_PROM_PORT_FLAG.findall(cmd), *_PORT_FLAG.findall(cmd))]
    order = [*flagged, *DEFAULT_PORTS[kind]]
    port = next((p for p in order if p in by_port), min(by_port))
    ip = by_port[port]
    host = "127.0.0.1" if ip in ("0.0.0.0", "::", "", "::1") or ip.startswith("127.") else ip
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/metrics"


class CpuSampler:
    """CPU ratio per role, from the change of each process' CPU seconds between calls."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[float, float, float]] = {}  # pid -> (start, t, cpu s)

    def sample(self, roles: Mapping[int, str | None], now: float) -> dict[str, float]:
        out: dict[str, float] = {}
        seen: set[int] = set()
        for pid, role in roles.items():
            if role is None:
                continue
            try:
                proc = psutil.Process(pid)
                with proc.oneshot():
                    start = proc.create_time()
                    times = proc.cpu_times()
            except (psutil.Error, OSError):
                continue
            seen.add(pid)
            cpu = times.user + times.system
            last = self._last.get(pid)
            self._last[pid] = (start, now, cpu)
            if last is None or last[0] != start or now <= last[1]:
                continue
            ratio = max(cpu - last[2], 0.0) / (now - last[1])
            out[role] = max(out.get(role, 0.0), ratio)
        for pid in [p for p in self._last if p not in seen]:
            del self._last[pid]
        return out


def pids_of_pod(pod_uid: str, candidates: Iterable[psutil.Process] | None = None) -> list[int]:
    """Engine server processes that belong to a pod, from their cgroup."""
    from exporter.k8s.cgroup import pod_uid_and_container_id

    out = []
    for proc in candidates if candidates is not None else psutil.process_iter(["cmdline"]):
        try:
            if engine_kind(" ".join(proc.cmdline())) is None:
                continue
        except (psutil.Error, OSError):
            continue
        uid, _ = pod_uid_and_container_id(proc.pid)
        if uid == pod_uid:
            out.append(proc.pid)
    return out
