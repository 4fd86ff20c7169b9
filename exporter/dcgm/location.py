"""Where the dcgm-exporter is: the setting, this node's dcgm-exporter pod, or loopback.

In Kubernetes the NVIDIA GPU Operator runs dcgm-exporter as a DaemonSet
(`nvidia-dcgm-exporter-*` pods, container `nvidia-dcgm-exporter`); its own Helm chart
names the pods `<release>-dcgm-exporter-*`. Either way the pod on this node carries
"dcgm-exporter" in its name and listens on 9400 (dcgm-exporter's `--address` default,
pkg/cmd/app.go).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from exporter.k8s.pods import PodInfo

DEFAULT_PORT = 9400
LOCAL_URL = f"http://127.0.0.1:{DEFAULT_PORT}/metrics"
SOURCES = ("configured", "kubernetes", "local", "simulated")
OFF = ("off", "none", "false", "no")


class DcgmTargetError(ValueError):
    """A dcgm_exporter setting that is no URL; the message says what was given."""


@dataclass(frozen=True)
class DcgmTarget:
    url: str
    source: str  # one of SOURCES


def normalize_url(spec: str) -> str:
    """`host:port`, `http://host:port` or a full URL -> the URL of its /metrics."""
    text = spec.strip()
    if "://" not in text:
        text = f"http://{text}"
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DcgmTargetError(f"setting 'dcgm_exporter' must be a URL or HOST:PORT, got {spec!r}")
    try:
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError:
        raise DcgmTargetError(f"setting 'dcgm_exporter' has a bad port: {spec!r}") from None
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    query = f"?{parts.query}" if parts.query else ""
    return f"{parts.scheme}://{parts.netloc}{path}{query}"


def is_dcgm_exporter_pod(pod: PodInfo) -> bool:
    names = [pod.name, *(name for name, _ in pod.containers)]
    return any("dcgm-exporter" in n for n in names)


def pod_targets(pods: Sequence[PodInfo]) -> list[DcgmTarget]:
    """This node's dcgm-exporter pods that have an IP, as scrape targets (sorted)."""
    found = [p for p in pods if is_dcgm_exporter_pod(p) and p.pod_ip]
    found.sort(key=lambda p: (p.namespace, p.name))
    out = []
    for p in found:
        host = f"[{p.pod_ip}]" if p.pod_ip and ":" in p.pod_ip else p.pod_ip
        out.append(DcgmTarget(f"http://{host}:{DEFAULT_PORT}/metrics", "kubernetes"))
    return out


def kubernetes(
    node: str, lister: Callable[[str], Sequence[PodInfo]] | None = None
) -> Callable[[], list[DcgmTarget]]:
    """A finder of this node's dcgm-exporter pod through the API server (in-cluster)."""

    def find() -> list[DcgmTarget]:
        from exporter.k8s.pods import list_node_pods

        return pod_targets(list(lister(node) if lister is not None else list_node_pods(node)))

    return find
