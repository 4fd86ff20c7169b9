"""The Kubernetes side of a simulated node whose GPUs are shared (a scenario's `sharing`):
a kubelet answering pod-resources List on a unix socket, an API server answering this
node's pod list on loopback, and the cgroup files of the simulated processes, so that
the exporter's own join (exporter/k8s) runs unchanged.

Each engine is a pod of its own (container `engine`) in the sharing namespace, each
tenant one (container `main`) in its namespace. Under time-slicing and MPS the kubelet
reports `<uuid>::<n>` replicas of `nvidia.com/gpu`, as NVIDIA's device plugin does when
sharing; under DRA each pod's GPUs come as devices `gpu-<index>` of driver
`gpu.nvidia.com` in a claim named `<pod>-gpu`. A tenant past its `until` is gone: from
the kubelet, the API server and NVML alike.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import threading
import uuid as uuidlib
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from exporter.k8s.podresources import Claim, encode_list_response
from exporter.sim.scenario import ScenarioError, Timeline
from exporter.sim.sharing import SharingSpec, tenant_pid

NODE = "sim-node"
DRA_DRIVER = "gpu.nvidia.com"


@dataclass(frozen=True)
class SimPod:
    namespace: str
    name: str
    container: str
    gpus: tuple[int, ...]
    pids: tuple[int, ...]
    labels: dict[str, str] = field(default_factory=dict)
    until: float = float("inf")

    @property
    def uid(self) -> str:
        return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"pod/{self.namespace}/{self.name}"))

    @property
    def container_id(self) -> str:
        return hashlib.sha256(f"{self.uid}/{self.container}".encode()).hexdigest()


def pods_of(timeline: Timeline) -> list[SimPod]:
    scn = timeline.scenario
    sharing = scn.sharing
    assert sharing is not None
    pods = [
        SimPod(
            sharing.namespace,
            e.name,
            "engine",
            e.gpus,
            tuple(scn.engine_pids(e.name).values()),
            {"app": e.name, "app.kubernetes.io/name": e.kind},
        )
        for e in scn.engines
    ]
    pods += [
        SimPod(
            t.namespace,
            t.name,
            "main",
            t.gpus,
            tuple(tenant_pid(i, g) for g in t.gpus),
            dict(t.labels),
            t.until,
        )
        for i, t in enumerate(sharing.tenants)
    ]
    return pods


def list_response(pods: Sequence[SimPod], sharing: SharingSpec, uuids: Sequence[str]) -> bytes:
    """What the kubelet's List answers for the pods alive now."""
    slot: dict[int, int] = {}
    devices: list[tuple[str, str, dict[str, dict[str, list[str]]]]] = []
    claims: dict[tuple[str, str, str], list[Claim]] = {}
    for pod in pods:
        if sharing.mode == "dra":
            devices.append((pod.namespace, pod.name, {pod.container: {}}))
            claims[(pod.namespace, pod.name, pod.container)] = [
                Claim(f"{pod.name}-gpu", pod.namespace, DRA_DRIVER, NODE, f"gpu-{g}") for g in pod.gpus
            ]
            continue
        ids = []
        for g in pod.gpus:
            n = slot[g] = slot.get(g, -1) + 1
            ids.append(f"{uuids[g]}::{n % sharing.replicas}")
        devices.append((pod.namespace, pod.name, {pod.container: {"nvidia.com/gpu": ids}}))
    return encode_list_response(devices, claims)


def pod_json(pod: SimPod, i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid, "labels": pod.labels},
        "spec": {"nodeName": NODE},
        "status": {
            "phase": "Running",
            "podIP": f"10.42.0.{10 + i}",
            "containerStatuses": [{"name": pod.container, "containerID": f"containerd://{pod.container_id}"}],
        },
    }


class SimKubernetes:
    """The kubelet, API server and cgroup files of a simulated node with shared GPUs."""

    def __init__(self, timeline: Timeline, uuids: Sequence[str]) -> None:
        try:
            import grpc  # the kubelet's protocol; only for scenarios that share GPUs
        except ImportError as err:
            raise ScenarioError(
                f"scenario {timeline.scenario.name!r} shares GPUs: its simulated kubelet needs grpcio "
                f"and protobuf ({err})"
            ) from err

        self._timeline = timeline
        self._uuids = list(uuids)
        self._pods = pods_of(timeline)
        # unix socket paths are limited to 107 bytes: a short directory of its own
        self.directory = tempfile.mkdtemp(prefix="llmgpu-k8s-", dir="/tmp")
        self.socket = str(Path(self.directory) / "kubelet.sock")
        self.proc_root = str(Path(self.directory) / "proc")
        for pod in self._pods:
            for pid in pod.pids:
                path = Path(self.proc_root) / str(pid)
                path.mkdir(parents=True, exist_ok=True)
                uid = pod.uid.replace("-", "_")
                (path / "cgroup").write_text(
                    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
                    f"cri-containerd-{pod.container_id}.scope\n"
                )
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    lambda request, context: self.list_bytes(),
                    request_deserializer=lambda data: data,
                    response_serializer=lambda data: data,
                )
            },
        )
        self._kubelet = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self._kubelet.add_generic_rpc_handlers((handler,))
        self._kubelet.add_insecure_port(f"unix:{self.socket}")
        self._kubelet.start()
        self._api = ThreadingHTTPServer(("127.0.0.1", 0), _api_handler(self))
        self._api.daemon_threads = True
        self.api_url = f"http://127.0.0.1:{self._api.server_address[1]}"
        self._thread = threading.Thread(target=self._api.serve_forever, name="sim-apiserver", daemon=True)
        self._thread.start()

    def alive(self) -> list[SimPod]:
        t = self._timeline.now()
        return [p for p in self._pods if t < p.until]

    def list_bytes(self) -> bytes:
        sharing = self._timeline.scenario.sharing
        assert sharing is not None
        return list_response(self.alive(), sharing, self._uuids)

    def pod_list(self) -> bytes:
        items = [pod_json(p, i) for i, p in enumerate(self.alive())]
        return json.dumps({"kind": "PodList", "items": items, "metadata": {}}).encode()

    def stop(self) -> None:
        self._api.shutdown()
        self._api.server_close()
        self._kubelet.stop(grace=None).wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def _api_handler(k8s: SimKubernetes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if not self.path.startswith("/api/v1/pods"):
                self.send_error(404)
                return
            body = k8s.pod_list()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # quiet
            return

    return Handler
