"""The pods on this node, from the Kubernetes API server, and the engines they announce.

Uses the in-cluster service account (token and CA under
``/var/run/secrets/kubernetes.io/serviceaccount``, ``KUBERNETES_SERVICE_HOST`` and
``KUBERNETES_SERVICE_PORT``) and lists ``/api/v1/pods`` with
``fieldSelector=spec.nodeName=<NODE_NAME>``, so the answer is this node's pods only.
RBAC cannot narrow ``list pods`` to one node; the field selector is what keeps the
request small.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import httpx

from exporter.k8s._refresh import BackgroundRefresher, RefreshStats
from exporter.k8s.cgroup import pod_uid_and_container_id
from exporter.k8s.podresources import PodRef

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
PAGE_SIZE = 500
_FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


class KubernetesConfigError(RuntimeError):
    """Not running in a cluster, or the service account is not mounted."""


@dataclass(frozen=True)
class PodInfo:
    """One pod on this node. Container ids are bare (no ``containerd://`` scheme)."""

    namespace: str
    name: str
    uid: str
    pod_ip: str | None
    annotations: Mapping[str, str] = field(hash=False)
    containers: tuple[tuple[str, str], ...]
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    def container_name(self, container_id: str) -> str | None:
        """The name of the container with this id, if it belongs to this pod."""
        for name, cid in self.containers:
            if cid == container_id:
                return name
        return None


@dataclass(frozen=True)
class ApiServer:
    """Where and how to reach the API server."""

    base_url: str
    token_path: str | None = None
    ca_path: str | None = None

    @classmethod
    def in_cluster(
        cls,
        environ: Mapping[str, str] | None = None,
        service_account_dir: str = SERVICE_ACCOUNT_DIR,
    ) -> ApiServer:
        """The in-cluster configuration every pod gets from the kubelet."""
        env = os.environ if environ is None else environ
        host = env.get("KUBERNETES_SERVICE_HOST")
        port = env.get("KUBERNETES_SERVICE_PORT", "443")
        token_path = os.path.join(service_account_dir, "token")
        ca_path = os.path.join(service_account_dir, "ca.crt")
        if not host:
            raise KubernetesConfigError("KUBERNETES_SERVICE_HOST is not set: not in a cluster")
        if not os.path.exists(token_path):
            raise KubernetesConfigError(
                f"no service-account token at {token_path}: is automountServiceAccountToken off?"
            )
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # IPv6 literal
        return cls(
            base_url=f"https://{host}:{port}",
            token_path=token_path,
            ca_path=ca_path if os.path.exists(ca_path) else None,
        )

    def client(self, timeout_s: float = 10.0) -> httpx.Client:
        verify: ssl.SSLContext | bool = True
        if self.ca_path is not None:
            verify = ssl.create_default_context(cafile=self.ca_path)
        return httpx.Client(base_url=self.base_url, verify=verify, timeout=timeout_s)

    def headers(self) -> dict[str, str]:
        """Request headers; the token is read every time (bound tokens rotate)."""
        headers = {"Accept": "application/json"}
        if self.token_path is not None:
            with open(self.token_path, encoding="utf-8") as handle:
                headers["Authorization"] = f"Bearer {handle.read().strip()}"
        return headers


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """This node's name, from ``NODE_NAME`` (the chart sets it from ``spec.nodeName``)."""
    env = os.environ if environ is None else environ
    name = env.get("NODE_NAME", "").strip()
    if not name:
        raise KubernetesConfigError("NODE_NAME is not set (downward API spec.nodeName)")
    return name


def _bare_container_id(container_id: str) -> str:
    _, sep, rest = container_id.partition("://")
    return rest if sep else container_id


def pod_from_json(item: Mapping[str, Any]) -> PodInfo:
    """A PodInfo from one item of a pod list."""
    metadata = item.get("metadata") or {}
    status = item.get("status") or {}
    containers: list[tuple[str, str]] = []
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for entry in status.get(key) or ():
            cid = entry.get("containerID")
            if cid:
                containers.append((str(entry.get("name", "")), _bare_container_id(str(cid))))
    annotations = metadata.get("annotations") or {}
    labels = metadata.get("labels") or {}
    return PodInfo(
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        uid=str(metadata.get("uid", "")),
        pod_ip=status.get("podIP") or None,
        annotations=MappingProxyType({str(k): str(v) for k, v in annotations.items()}),
        containers=tuple(containers),
        labels=MappingProxyType({str(k): str(v) for k, v in labels.items()}),
    )


def list_node_pods(
    node: str,
    api: ApiServer | None = None,
    *,
    client: httpx.Client | None = None,
    timeout_s: float = 10.0,
) -> list[PodInfo]:
    """The pods scheduled on ``node`` that have not finished, all pages of them."""
    api = ApiServer.in_cluster() if api is None else api
    own_client = client is None
    http = api.client(timeout_s) if client is None else client
    selector = f"spec.nodeName={node}," + ",".join(
        f"status.phase!={phase}" for phase in sorted(_FINISHED_PHASES)
    )
    pods: list[PodInfo] = []
    try:
        token = ""
        while True:
            params = {"fieldSelector": selector, "limit": str(PAGE_SIZE)}
            if token:
                params["continue"] = token
            response = http.get("/api/v1/pods", params=params, headers=api.headers())
            response.raise_for_status()
            body = response.json()
            for item in body.get("items") or ():
                if (item.get("status") or {}).get("phase") in _FINISHED_PHASES:
                    continue
                pods.append(pod_from_json(item))
            token = str((body.get("metadata") or {}).get("continue") or "")
            if not token:
                return pods
    finally:
        if own_client:
            http.close()


DEFAULT_SCRAPE_ANNOTATION = "llm-gpu-exporter.io/scrape"


@dataclass(frozen=True)
class EngineAnnotations:
    """Pod annotations that announce an inference engine to scrape.

    All share the prefix of the scrape annotation: with ``prometheus.io/scrape`` the
    port, path and scheme come from ``prometheus.io/port``, ``/path`` and ``/scheme``,
    the usual convention; ``<prefix>/engine`` names the engine (vllm, sglang, tgi).
    """

    scrape: str = DEFAULT_SCRAPE_ANNOTATION
    port: str = "llm-gpu-exporter.io/port"
    path: str = "llm-gpu-exporter.io/path"
    scheme: str = "llm-gpu-exporter.io/scheme"
    engine: str = "llm-gpu-exporter.io/engine"

    @classmethod
    def from_scrape_annotation(cls, scrape: str) -> EngineAnnotations:
        """The set of annotations that share ``scrape``'s prefix."""
        prefix = scrape.rsplit("/", 1)[0] + "/" if "/" in scrape else ""
        return cls(
            scrape=scrape,
            port=prefix + "port",
            path=prefix + "path",
            scheme=prefix + "scheme",
            engine=prefix + "engine",
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EngineAnnotations:
        """From ``LLMGPU_ENGINE_ANNOTATION`` (the ``engine_annotation`` setting), else defaults."""
        env = os.environ if environ is None else environ
        scrape = env.get("LLMGPU_ENGINE_ANNOTATION", "").strip()
        return cls.from_scrape_annotation(scrape) if scrape else cls()


@dataclass(frozen=True)
class EngineTarget:
    """An engine endpoint found on a pod of this node."""

    url: str
    engine: str | None
    namespace: str
    pod: str


DEFAULT_ENGINE_PORT = 8000


def engine_targets(
    pods: Iterable[PodInfo], annotations: EngineAnnotations | None = None
) -> list[EngineTarget]:
    """Engine endpoints of the pods whose scrape annotation is ``"true"``, sorted by URL."""
    names = EngineAnnotations() if annotations is None else annotations
    targets: list[EngineTarget] = []
    for pod in pods:
        notes = pod.annotations
        if notes.get(names.scrape, "").strip().lower() != "true" or not pod.pod_ip:
            continue
        try:
            port = int(notes.get(names.port, DEFAULT_ENGINE_PORT))
        except ValueError:
            continue
        if not 0 < port < 65536:
            continue
        path = notes.get(names.path, "/metrics") or "/metrics"
        if not path.startswith("/"):
            path = "/" + path
        scheme = notes.get(names.scheme, "http").strip().lower()
        if scheme not in ("http", "https"):
            continue
        host = f"[{pod.pod_ip}]" if ":" in pod.pod_ip else pod.pod_ip
        targets.append(
            EngineTarget(
                url=f"{scheme}://{host}:{port}{path}",
                engine=notes.get(names.engine) or None,
                namespace=pod.namespace,
                pod=pod.name,
            )
        )
    return sorted(targets, key=lambda target: target.url)


class NodePodsWatcher:
    """This node's pods, listed in the background; lookups never call the API server."""

    def __init__(
        self,
        node: str,
        api: ApiServer | None = None,
        refresh_s: float = 30.0,
        *,
        timeout_s: float = 10.0,
        proc_root: str = "/proc",
        start: bool = True,
    ) -> None:
        self._node = node
        self._api = ApiServer.in_cluster() if api is None else api
        self._timeout_s = timeout_s
        self._proc_root = proc_root
        self._refresher: BackgroundRefresher[dict[str, PodInfo]] = BackgroundRefresher(
            "node-pods", self._fetch, {}, refresh_s, start=start
        )

    def _fetch(self) -> dict[str, PodInfo]:
        pods = list_node_pods(self._node, self._api, timeout_s=self._timeout_s)
        return {pod.uid: pod for pod in pods}

    def refresh(self) -> bool:
        return self._refresher.refresh()

    def pods(self) -> list[PodInfo]:
        return sorted(self._refresher.value.values(), key=lambda pod: (pod.namespace, pod.name))

    def by_uid(self, uid: str) -> PodInfo | None:
        return self._refresher.value.get(uid)

    def by_name(self, namespace: str, name: str) -> PodInfo | None:
        return next(
            (p for p in self._refresher.value.values() if (p.namespace, p.name) == (namespace, name)), None
        )

    def ref_for(self, pod_uid: str | None, container_id: str | None) -> PodRef | None:
        """The namespace, pod and container of a (pod UID, container id) pair."""
        if pod_uid is None:
            return None
        pod = self._refresher.value.get(pod_uid)
        if pod is None:
            return None
        container = pod.container_name(container_id) if container_id else None
        return PodRef(namespace=pod.namespace, pod=pod.name, container=container or "")

    def ref_for_pid(self, pid: int) -> PodRef | None:
        """The owner of a process, from its cgroup and the cached pod list."""
        return self.ref_for(*pod_uid_and_container_id(pid, self._proc_root))

    def engine_targets(self, annotations: EngineAnnotations | None = None) -> list[EngineTarget]:
        return engine_targets(self._refresher.value.values(), annotations)

    @property
    def stats(self) -> RefreshStats:
        return self._refresher.stats

    def stop(self) -> None:
        self._refresher.stop()
