"""The pod-resources client against a fake kubelet gRPC server on a unix socket."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import pytest

from exporter.k8s import podresources
from exporter.k8s.podresources import (
    LIST_METHOD,
    Claim,
    PodRef,
    PodResourcesUnavailableError,
    PodResourcesWatcher,
    decode_list_response,
    encode_list_response,
    normalize_device_id,
)

grpc = pytest.importorskip("grpc")
pytest.importorskip("google.protobuf")

GPU0 = "GPU-5a0c3e8f-1d2b-4c6a-9e7f-0123456789ab"
GPU1 = "GPU-77e1c0de-aaaa-bbbb-cccc-ddddeeeeffff"
GPU2 = "GPU-0b5ef4e2-1111-2222-3333-444455556666"
MIG0 = "MIG-2f1c8a77-5e0b-5d1a-8c3b-9a8f7e6d5c4b"


class FakeKubelet:
    """A pod-resources server: answers List with whatever ``response`` holds."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.response = b""
        self.calls = 0
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    def _list(self, request: bytes, context: object) -> bytes:
        assert request == b""  # ListPodResourcesRequest has no fields
        with self._lock:
            self.calls += 1
            return self.response

    def start(self) -> None:
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    self._list,
                    request_deserializer=lambda data: data,
                    response_serializer=lambda data: data,
                )
            },
        )
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix:{self.socket_path}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    # unix socket paths are limited to 107 bytes: pytest's tmp_path can be longer
    directory = tempfile.mkdtemp(prefix="podres-", dir="/tmp")
    fake = FakeKubelet(str(Path(directory) / "kubelet.sock"))
    fake.start()
    yield fake
    fake.stop()
    shutil.rmtree(directory, ignore_errors=True)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


CLUSTER = [
    ("llm", "vllm-0", {"engine": {"nvidia.com/gpu": [GPU0, GPU1]}, "sidecar": {}}),
    ("llm", "vllm-mig", {"engine": {"nvidia.com/mig-1g.10gb": [MIG0]}}),
    # time-slicing: two replicas of one GPU in two pods
    ("batch", "a", {"main": {"nvidia.com/gpu": [f"{GPU2}::0"]}}),
    ("batch", "b", {"main": {"nvidia.com/gpu": [f"{GPU2}::1"]}}),
    ("kube-system", "net", {"cni": {"example.com/sriov": ["0000:3b:00.1"]}}),
]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_decodes_wire_bytes_with_the_kubelet_field_numbers() -> None:
    # Encoded by hand from k8s.io/kubelet/pkg/apis/podresources/v1/api.proto:
    # PodResources{name=1, namespace=2, containers=3}, ContainerResources{name=1,
    # devices=2, cpu_ids=3 (packed int64)}, ContainerDevices{resource_name=1, device_ids=2}.
    devices = _len_field(1, b"nvidia.com/gpu") + _len_field(2, GPU0.encode())
    container = _len_field(1, b"engine") + _len_field(2, devices) + _len_field(3, b"\x02\x03")
    pod = _len_field(1, b"vllm-0") + _len_field(2, b"llm") + _len_field(3, container)
    unknown = _varint(9 << 3 | 0) + _varint(7)  # fields added by newer kubelets are skipped
    (assignment,) = decode_list_response(_len_field(1, pod) + unknown)
    assert assignment.resource == "nvidia.com/gpu"
    assert assignment.device_id == GPU0
    assert assignment.ref == PodRef("llm", "vllm-0", "engine")


def test_decodes_dra_devices_with_the_kubelet_field_numbers() -> None:
    # ContainerResources{dynamic_resources=5}, DynamicResource{claim_name=2,
    # claim_namespace=3, claim_resources=4}, ClaimResource{cdi_devices=1, driver_name=2,
    # pool_name=3, device_name=4}, CDIDevice{name=1} (the v1 api.proto since Kubernetes 1.31).
    cdi = _len_field(1, b"k8s.gpu.nvidia.com/claim=abc-gpu-0")
    resource = _len_field(1, cdi) + _len_field(2, b"gpu.nvidia.com") + _len_field(3, b"node-a")
    resource += _len_field(4, b"gpu-0")
    other = _len_field(2, b"net.example.com") + _len_field(4, b"nic-0")  # not a GPU driver
    dynamic = _len_field(2, b"llama-gpu") + _len_field(3, b"llm") + _len_field(4, resource)
    dynamic += _len_field(4, other)
    container = _len_field(1, b"engine") + _len_field(5, dynamic)
    pod = _len_field(1, b"llama-0") + _len_field(2, b"llm") + _len_field(3, container)
    (assignment,) = decode_list_response(_len_field(1, pod))
    assert (assignment.resource, assignment.device_id) == ("gpu.nvidia.com", "gpu-0")
    assert assignment.ref == PodRef("llm", "llama-0", "engine")
    assert assignment.claim == Claim("llama-gpu", "llm", "gpu.nvidia.com", "node-a", "gpu-0")


def test_watcher_keeps_the_claim_of_a_dra_device(kubelet: FakeKubelet) -> None:
    claim = Claim("llama-gpu", "llm", "gpu.nvidia.com", "node-a", "gpu-1")
    kubelet.response = encode_list_response(
        [("llm", "llama-0", {"engine": {}})], {("llm", "llama-0", "engine"): [claim]}
    )
    watcher = PodResourcesWatcher(kubelet.socket_path, refresh_s=60, start=False)
    try:
        assert watcher.refresh()
        assert watcher.lookup("gpu-1") == PodRef("llm", "llama-0", "engine")
        assert watcher.claim("gpu-1") == claim
        assert watcher.claim("gpu-0") is None
    finally:
        watcher.stop()


def test_encode_and_decode_round_trip_filters_non_gpu_resources() -> None:
    assignments = decode_list_response(encode_list_response(CLUSTER))
    assert {a.resource for a in assignments} == {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb"}
    assert len(assignments) == 5


def test_normalize_device_id() -> None:
    assert normalize_device_id(f"{GPU0}::3") == GPU0.lower()
    assert normalize_device_id(MIG0.upper()) == MIG0.lower()


def test_watcher_maps_gpus_mig_and_shared_devices(kubelet: FakeKubelet) -> None:
    kubelet.response = encode_list_response(CLUSTER)
    watcher = PodResourcesWatcher(kubelet.socket_path, refresh_s=60, start=False)
    try:
        assert watcher.refresh()
        assert watcher.lookup(GPU0) == PodRef("llm", "vllm-0", "engine")
        assert watcher.lookup(GPU1.upper()) == PodRef("llm", "vllm-0", "engine")
        assert watcher.lookup(MIG0) == PodRef("llm", "vllm-mig", "engine")
        # a time-sliced GPU has no single owner; all of them are listed
        assert watcher.lookup(GPU2) is None
        assert watcher.lookup_all(GPU2) == (
            PodRef("batch", "a", "main"),
            PodRef("batch", "b", "main"),
        )
        assert watcher.lookup("GPU-not-allocated") is None
        assert watcher.stats.errors_total == 0
    finally:
        watcher.stop()


def test_lookups_are_served_from_the_cache(kubelet: FakeKubelet) -> None:
    kubelet.response = encode_list_response(CLUSTER)
    watcher = PodResourcesWatcher(kubelet.socket_path, refresh_s=60, start=False)
    try:
        watcher.refresh()
        calls = kubelet.calls
        for _ in range(1000):
            watcher.lookup(GPU0)
        assert kubelet.calls == calls == 1
    finally:
        watcher.stop()


def test_background_thread_refreshes(kubelet: FakeKubelet) -> None:
    kubelet.response = encode_list_response(CLUSTER[:1])
    watcher = PodResourcesWatcher(kubelet.socket_path, refresh_s=0.05)
    try:
        wait_for(lambda: watcher.lookup(GPU0) is not None)
        assert watcher.lookup(MIG0) is None
        kubelet.response = encode_list_response(CLUSTER[1:2])  # vllm-0 ended, vllm-mig started
        wait_for(lambda: watcher.lookup(MIG0) is not None)
        assert watcher.lookup(GPU0) is None
        assert watcher.stats.refreshes_total >= 2
    finally:
        watcher.stop()


def test_errors_are_counted_and_the_last_good_mapping_kept(kubelet: FakeKubelet) -> None:
    kubelet.response = encode_list_response(CLUSTER)
    watcher = PodResourcesWatcher(kubelet.socket_path, refresh_s=60, timeout_s=1, start=False)
    try:
        assert watcher.refresh()
        kubelet.stop()  # the kubelet restarts
        assert not watcher.refresh()
        assert not watcher.refresh()
        stats = watcher.stats
        assert stats.errors_total == 2
        assert stats.last_error
        assert watcher.lookup(GPU0) == PodRef("llm", "vllm-0", "engine")
        # back on the same socket path with a new answer: the client reconnects
        kubelet.response = encode_list_response(CLUSTER[1:2])
        kubelet.start()
        wait_for(watcher.refresh)
        assert watcher.lookup(GPU0) is None
        assert watcher.lookup(MIG0) == PodRef("llm", "vllm-mig", "engine")
        assert watcher.stats.last_error is None
    finally:
        watcher.stop()


def test_missing_socket_is_an_error_not_a_crash() -> None:
    watcher = PodResourcesWatcher("/nonexistent/kubelet.sock", refresh_s=60, timeout_s=0.5, start=False)
    try:
        assert not watcher.refresh()
        assert watcher.stats.errors_total == 1
        assert watcher.mapping() == {}
    finally:
        watcher.stop()


def test_list_method_name() -> None:
    assert LIST_METHOD == "/v1.PodResourcesLister/List"


def test_import_needs_no_grpc() -> None:
    code = (
        "import sys\n"
        "sys.modules['grpc'] = None\n"  # makes `import grpc` fail
        "import exporter.k8s.podresources as pr\n"
        "assert 'grpc' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "try:\n"
        "    pr.PodResourcesWatcher('/x.sock', start=False)\n"
        "except pr.PodResourcesUnavailableError as exc:\n"
        "    print('unavailable:', exc)\n"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert "unavailable: pod attribution needs grpcio" in result.stdout


def test_unavailable_error_is_a_runtime_error() -> None:
    assert issubclass(PodResourcesUnavailableError, RuntimeError)
    assert podresources.DEFAULT_SOCKET == "/var/lib/kubelet/pod-resources/kubelet.sock"
