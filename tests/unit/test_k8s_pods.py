"""Listing this node's pods against a loopback fake API server."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from exporter.k8s.podresources import PodRef
from exporter.k8s.pods import (
    ApiServer,
    EngineAnnotations,
    KubernetesConfigError,
    NodePodsWatcher,
    PodInfo,
    engine_targets,
    list_node_pods,
    node_name,
)

TOKEN = "test-token-1"
CID_A = "a" * 64
CID_B = "b" * 64
CID_C = "c" * 64
UID_A = "11111111-2222-3333-4444-555555555555"


def pod(
    name: str,
    node: str,
    *,
    namespace: str = "llm",
    uid: str | None = None,
    phase: str = "Running",
    ip: str | None = "10.0.0.7",
    annotations: dict[str, str] | None = None,
    containers: dict[str, str] | None = None,
) -> dict[str, Any]:
    statuses = [
        {"name": cname, "containerID": f"containerd://{cid}", "ready": True}
        for cname, cid in (containers or {}).items()
    ]
    item: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"},
        "spec": {"nodeName": node},
        "status": {"phase": phase, "containerStatuses": statuses},
    }
    if annotations:
        item["metadata"]["annotations"] = annotations
    if ip:
        item["status"]["podIP"] = ip
    return item


PODS = [
    pod(
        "vllm-0",
        "node-a",
        uid=UID_A,
        annotations={"llm-gpu-exporter.io/scrape": "true", "llm-gpu-exporter.io/engine": "vllm"},
        containers={"engine": CID_A, "proxy": CID_B},
    ),
    pod("other-node", "node-b", containers={"x": CID_C}),
    pod("done", "node-a", phase="Succeeded", ip=None),
    pod(
        "sglang-0",
        "node-a",
        namespace="research",
        ip="10.0.0.9",
        annotations={
            "llm-gpu-exporter.io/scrape": "TRUE",
            "llm-gpu-exporter.io/port": "30000",
            "llm-gpu-exporter.io/path": "metrics",
        },
    ),
    pod(
        "no-ip-yet",
        "node-a",
        phase="Pending",
        ip=None,
        annotations={"llm-gpu-exporter.io/scrape": "true"},
    ),
    pod("web", "node-a", namespace="default", annotations={"prometheus.io/scrape": "true"}),
]


class FakeApiServer:
    """Serves GET /api/v1/pods, honouring spec.nodeName, paging two items at a time."""

    page_size = 2

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.pods = list(PODS)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                fake.requests.append(
                    {"path": url.path, "query": query, "auth": self.headers.get("Authorization")}
                )
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._send(401, {"kind": "Status", "code": 401})
                    return
                if url.path != "/api/v1/pods":
                    self._send(404, {"kind": "Status", "code": 404})
                    return
                node = ""
                for term in query.get("fieldSelector", "").split(","):
                    if term.startswith("spec.nodeName="):
                        node = term.split("=", 1)[1]
                # status.phase selectors deliberately ignored: the client filters too
                items = [p for p in fake.pods if p["spec"]["nodeName"] == node]
                start = int(query.get("continue", "0"))
                page = items[start : start + fake.page_size]
                more = start + fake.page_size < len(items)
                body = {
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "metadata": {"continue": str(start + fake.page_size)} if more else {},
                    "items": page,
                }
                self._send(200, body)

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture
def api_server() -> Iterator[FakeApiServer]:
    fake = FakeApiServer()
    yield fake
    fake.close()


def test_lists_this_nodes_running_pods(api_server: FakeApiServer, token_file: Path) -> None:
    api = ApiServer(f"http://127.0.0.1:{api_server.port}", token_path=str(token_file))
    pods = list_node_pods("node-a", api)
    assert [p.name for p in pods] == ["vllm-0", "sglang-0", "no-ip-yet", "web"]
    first = pods[0]
    assert first == PodInfo(
        namespace="llm",
        name="vllm-0",
        uid=UID_A,
        pod_ip="10.0.0.7",
        annotations={"llm-gpu-exporter.io/scrape": "true", "llm-gpu-exporter.io/engine": "vllm"},
        containers=(("engine", CID_A), ("proxy", CID_B)),
    )
    assert first.container_name(CID_B) == "proxy"
    assert hash(first)  # frozen and hashable despite the annotations mapping
    with pytest.raises(TypeError):
        first.annotations["x"] = "y"  # type: ignore[index]
    # three pages of two, each with the node's field selector and the token
    assert len(api_server.requests) == 3
    for request in api_server.requests:
        selector = request["query"]["fieldSelector"].split(",")
        assert "spec.nodeName=node-a" in selector
        assert "status.phase!=Succeeded" in selector
        assert request["auth"] == f"Bearer {TOKEN}"
    assert "continue" not in api_server.requests[0]["query"]
    assert api_server.requests[1]["query"]["continue"] == "2"


def test_token_is_reread_for_every_request(api_server: FakeApiServer, token_file: Path) -> None:
    api = ApiServer(f"http://127.0.0.1:{api_server.port}", token_path=str(token_file))
    token_file.write_text("rotated-and-wrong")
    with pytest.raises(httpx.HTTPStatusError):
        list_node_pods("node-a", api)


def test_engine_targets_from_annotations(api_server: FakeApiServer, token_file: Path) -> None:
    api = ApiServer(f"http://127.0.0.1:{api_server.port}", token_path=str(token_file))
    targets = engine_targets(list_node_pods("node-a", api))
    assert [(t.url, t.engine, t.namespace, t.pod) for t in targets] == [
        ("http://10.0.0.7:8000/metrics", "vllm", "llm", "vllm-0"),
        ("http://10.0.0.9:30000/metrics", None, "research", "sglang-0"),
    ]
    # the annotation names are configurable: the prometheus.io convention works as is
    names = EngineAnnotations.from_env({"LLMGPU_ENGINE_ANNOTATION": "prometheus.io/scrape"})
    assert names == EngineAnnotations(
        scrape="prometheus.io/scrape",
        port="prometheus.io/port",
        path="prometheus.io/path",
        scheme="prometheus.io/scheme",
        engine="prometheus.io/engine",
    )
    assert EngineAnnotations.from_env({}) == EngineAnnotations()
    assert [t.pod for t in engine_targets(list_node_pods("node-a", api), names)] == ["web"]


def test_engine_targets_reject_bad_annotations() -> None:
    def with_notes(**notes: str) -> PodInfo:
        base = {"llm-gpu-exporter.io/scrape": "true"}
        base.update({f"llm-gpu-exporter.io/{k}": v for k, v in notes.items()})
        return PodInfo("ns", "p", "u", "fd00::5", base, ())

    assert engine_targets([with_notes()])[0].url == "http://[fd00::5]:8000/metrics"
    assert engine_targets([with_notes(scheme="https")])[0].url.startswith("https://")
    assert engine_targets([with_notes(port="http")]) == []
    assert engine_targets([with_notes(port="70000")]) == []
    assert engine_targets([with_notes(scheme="ftp")]) == []


def test_watcher_attributes_processes(api_server: FakeApiServer, token_file: Path, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "77").mkdir(parents=True)
    systemd_uid = UID_A.replace("-", "_")
    (proc / "77" / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{systemd_uid}.slice/cri-containerd-{CID_A}.scope\n"
    )
    api = ApiServer(f"http://127.0.0.1:{api_server.port}", token_path=str(token_file))
    watcher = NodePodsWatcher("node-a", api, refresh_s=60, proc_root=str(proc), start=False)
    try:
        assert watcher.refresh()
        requests = len(api_server.requests)
        assert watcher.ref_for_pid(77) == PodRef("llm", "vllm-0", "engine")
        assert watcher.ref_for_pid(78) is None
        assert watcher.ref_for(UID_A, None) == PodRef("llm", "vllm-0", "")
        assert watcher.by_uid("uid-web") is not None
        assert len(watcher.engine_targets()) == 2
        assert len(api_server.requests) == requests  # lookups never call the API server
        api_server.close()
        assert not watcher.refresh()
        assert watcher.stats.errors_total == 1
        assert watcher.ref_for_pid(77) == PodRef("llm", "vllm-0", "engine")  # last good list kept
    finally:
        watcher.stop()


def test_in_cluster_config_over_tls(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "ca.crt", tmp_path / "tls.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=kubernetes", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    fake = FakeApiServer(tls)
    try:
        service_account = tmp_path / "serviceaccount"
        service_account.mkdir()
        (service_account / "token").write_text(TOKEN)
        shutil.copy(cert, service_account / "ca.crt")
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(fake.port)}
        api = ApiServer.in_cluster(env, str(service_account))
        assert api.base_url == f"https://127.0.0.1:{fake.port}"
        assert [p.name for p in list_node_pods("node-b", api)] == ["other-node"]
        # without the cluster CA the server is not trusted
        untrusted = ApiServer(api.base_url, token_path=api.token_path)
        with pytest.raises(httpx.ConnectError):
            list_node_pods("node-b", untrusted)
    finally:
        fake.close()


def test_in_cluster_config_errors(tmp_path: Path) -> None:
    with pytest.raises(KubernetesConfigError, match="KUBERNETES_SERVICE_HOST"):
        ApiServer.in_cluster({}, str(tmp_path))
    with pytest.raises(KubernetesConfigError, match="token"):
        ApiServer.in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, str(tmp_path))
    (tmp_path / "token").write_text("t")
    api = ApiServer.in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1"}, str(tmp_path))
    assert api.base_url == "https://[fd00::1]:443"
    assert api.ca_path is None


def test_node_name() -> None:
    assert node_name({"NODE_NAME": "gpu-node-7"}) == "gpu-node-7"
    with pytest.raises(KubernetesConfigError):
        node_name({})
