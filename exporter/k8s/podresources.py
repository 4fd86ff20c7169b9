"""Which pod and container hold each GPU, from the kubelet pod-resources API (v1 ``List``).

The kubelet serves ``k8s.io/kubelet/pkg/apis/podresources/v1`` on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``). ``List`` returns, per pod and
container, the device-plugin devices it was given. NVIDIA's device plugin reports
``nvidia.com/gpu`` device ids as GPU UUIDs (``GPU-...``) and MIG devices as MIG UUIDs
(``MIG-...``); with time-slicing each replica gets ``<uuid>::<n>``.

The messages are described here by hand (only the fields this module reads), so the
runtime needs ``grpcio`` and ``protobuf`` and no generated code. Both are imported
lazily: importing this module costs nothing when attribution is off.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.k8s._refresh import BackgroundRefresher, RefreshStats

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
GPU_RESOURCE_PREFIXES = ("nvidia.com/",)
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

_PACKAGE = "v1"


class PodResourcesUnavailableError(RuntimeError):
    """grpcio or protobuf is missing, so the pod-resources API cannot be read."""


@dataclass(frozen=True, order=True)
class PodRef:
    """The Kubernetes owner of a GPU, process or engine."""

    namespace: str
    pod: str
    container: str


@dataclass(frozen=True)
class Claim:
    """A DRA device in a container's resource claim."""

    name: str
    namespace: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True)
class DeviceAssignment:
    """One device id handed to one container, as the kubelet reports it. A DRA device's id
    is its device name, and `claim` says which claim it came from."""

    resource: str
    device_id: str
    ref: PodRef
    claim: Claim | None = None


DRA_DRIVERS = ("gpu.nvidia.com",)  # DRA drivers whose devices are GPUs


def normalize_device_id(device_id: str) -> str:
    """The GPU or MIG UUID behind a device id: drops the ``::<n>`` of shared replicas."""
    base, _, _ = device_id.partition("::")
    return base.strip().lower()


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise PodResourcesUnavailableError(
            f"pod attribution needs grpcio and protobuf ({exc}); install them or turn attribution off"
        ) from exc


def _field(name: str, number: int, kind: str, *, repeated: bool = False, type_name: str = "") -> Any:
    descriptor_pb2 = _import("google.protobuf.descriptor_pb2")
    fdp = descriptor_pb2.FieldDescriptorProto
    field = fdp(
        name=name,
        number=number,
        type=getattr(fdp, f"TYPE_{kind}"),
        label=fdp.LABEL_REPEATED if repeated else fdp.LABEL_OPTIONAL,
    )
    if type_name:
        field.type_name = f".{_PACKAGE}.{type_name}"
    return field


@functools.lru_cache(maxsize=1)
def _message_classes() -> dict[str, Any]:
    """Message classes for the subset of podresources/v1/api.proto that List uses."""
    descriptor_pb2 = _import("google.protobuf.descriptor_pb2")
    descriptor_pool = _import("google.protobuf.descriptor_pool")
    message_factory = _import("google.protobuf.message_factory")

    layout: dict[str, list[Any]] = {
        "ListPodResourcesRequest": [],
        "ListPodResourcesResponse": [
            _field("pod_resources", 1, "MESSAGE", repeated=True, type_name="PodResources"),
        ],
        "PodResources": [
            _field("name", 1, "STRING"),
            _field("namespace", 2, "STRING"),
            _field("containers", 3, "MESSAGE", repeated=True, type_name="ContainerResources"),
        ],
        "ContainerResources": [
            _field("name", 1, "STRING"),
            _field("devices", 2, "MESSAGE", repeated=True, type_name="ContainerDevices"),
            _field("cpu_ids", 3, "INT64", repeated=True),
            _field("dynamic_resources", 5, "MESSAGE", repeated=True, type_name="DynamicResource"),
        ],
        "DynamicResource": [  # field 1 (class_name) is gone from the proto
            _field("claim_name", 2, "STRING"),
            _field("claim_namespace", 3, "STRING"),
            _field("claim_resources", 4, "MESSAGE", repeated=True, type_name="ClaimResource"),
        ],
        "ClaimResource": [
            _field("cdi_devices", 1, "MESSAGE", repeated=True, type_name="CDIDevice"),
            _field("driver_name", 2, "STRING"),
            _field("pool_name", 3, "STRING"),
            _field("device_name", 4, "STRING"),
        ],
        "CDIDevice": [_field("name", 1, "STRING")],
        "ContainerDevices": [
            _field("resource_name", 1, "STRING"),
            _field("device_ids", 2, "STRING", repeated=True),
        ],
    }
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="llm_gpu_exporter/podresources_v1.proto", package=_PACKAGE, syntax="proto3"
    )
    for message_name, fields in layout.items():
        file_proto.message_type.add(name=message_name).field.extend(fields)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(file_proto.SerializeToString())

    def message_class(name: str) -> Any:
        descriptor = pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")
        get_class = getattr(message_factory, "GetMessageClass", None)
        if get_class is not None:
            return get_class(descriptor)
        return message_factory.MessageFactory(pool).GetPrototype(descriptor)  # protobuf < 4.22

    return {name: message_class(name) for name in layout}


def decode_list_response(
    data: bytes,
    resource_prefixes: Sequence[str] = GPU_RESOURCE_PREFIXES,
    dra_drivers: Sequence[str] = DRA_DRIVERS,
) -> list[DeviceAssignment]:
    """The device assignments in a serialized ``ListPodResourcesResponse``."""
    response = _message_classes()["ListPodResourcesResponse"].FromString(data)
    out: list[DeviceAssignment] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = PodRef(namespace=str(pod.namespace), pod=str(pod.name), container=str(container.name))
            for devices in container.devices:
                resource = str(devices.resource_name)
                if not resource.startswith(tuple(resource_prefixes)):
                    continue
                out.extend(
                    DeviceAssignment(resource=resource, device_id=str(device_id), ref=ref)
                    for device_id in devices.device_ids
                )
            for dynamic in container.dynamic_resources:
                for res in dynamic.claim_resources:
                    if str(res.driver_name) not in dra_drivers:
                        continue
                    claim = Claim(
                        name=str(dynamic.claim_name),
                        namespace=str(dynamic.claim_namespace),
                        driver=str(res.driver_name),
                        pool=str(res.pool_name),
                        device=str(res.device_name),
                    )
                    out.append(DeviceAssignment(claim.driver, claim.device, ref, claim))
    return out


def encode_list_response(
    pods: Iterable[tuple[str, str, Mapping[str, Mapping[str, Sequence[str]]]]],
    claims: Mapping[tuple[str, str, str], Sequence[Claim]] | None = None,
) -> bytes:
    """Serialize a ``ListPodResourcesResponse``: for fake kubelets in tests and the simulator.

    ``pods`` holds ``(namespace, pod, {container: {resource_name: [device ids]}})``;
    ``claims`` the DRA devices of ``(namespace, pod, container)``, one claim per device.
    """
    classes = _message_classes()
    response = classes["ListPodResourcesResponse"]()
    for namespace, pod_name, containers in pods:
        pod = response.pod_resources.add(name=pod_name, namespace=namespace)
        for container_name, resources in containers.items():
            container = pod.containers.add(name=container_name)
            for resource_name, device_ids in resources.items():
                container.devices.add(resource_name=resource_name, device_ids=list(device_ids))
            for claim in (claims or {}).get((namespace, pod_name, container_name), ()):
                dynamic = container.dynamic_resources.add(
                    claim_name=claim.name, claim_namespace=claim.namespace
                )
                res = dynamic.claim_resources.add(
                    driver_name=claim.driver, pool_name=claim.pool, device_name=claim.device
                )
                res.cdi_devices.add(name=f"k8s.{claim.driver}/claim={claim.name}-{claim.device}")
    data: bytes = response.SerializeToString()
    return data


def build_mapping(assignments: Iterable[DeviceAssignment]) -> dict[str, tuple[PodRef, ...]]:
    """Normalized device UUID -> the distinct containers holding it, sorted."""
    owners: dict[str, set[PodRef]] = {}
    for assignment in assignments:
        owners.setdefault(normalize_device_id(assignment.device_id), set()).add(assignment.ref)
    return {uuid: tuple(sorted(refs)) for uuid, refs in owners.items()}


class PodResourcesClient:
    """A minimal pod-resources v1 client: one unix-socket channel, one method (List)."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout_s: float = 5.0) -> None:
        self._grpc = _import("grpc")
        _message_classes()  # fail here, not at the first List, when protobuf is missing
        self.socket_path = socket_path
        self._timeout_s = timeout_s
        self._channel: Any = None

    def _call(self) -> Any:
        if self._channel is None:
            self._channel = self._grpc.insecure_channel(
                f"unix:{self.socket_path}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
            )
        return self._channel.unary_unary(
            LIST_METHOD,
            request_serializer=_identity,
            response_deserializer=_identity,
        )

    def list(self, resource_prefixes: Sequence[str] = GPU_RESOURCE_PREFIXES) -> list[DeviceAssignment]:
        """Call List; the channel is rebuilt after a failure (the kubelet may have restarted)."""
        try:
            raw = self._call()(b"", timeout=self._timeout_s)
        except Exception:
            self.close()
            raise
        return decode_list_response(bytes(raw), resource_prefixes)

    def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()


def _identity(data: bytes) -> bytes:
    return data


Mapping_ = dict[str, tuple[PodRef, ...]]
Claims = dict[str, Claim]


class PodResourcesWatcher:
    """GPU UUID -> owning container, refreshed in the background; lookups never call the kubelet.

    A failed refresh is counted (``stats.errors_total``) and the last good mapping stays.
    """

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        refresh_s: float = 10.0,
        *,
        timeout_s: float = 5.0,
        resource_prefixes: Sequence[str] = GPU_RESOURCE_PREFIXES,
        start: bool = True,
    ) -> None:
        self._client = PodResourcesClient(socket_path, timeout_s=timeout_s)
        self._prefixes = tuple(resource_prefixes)
        self._refresher: BackgroundRefresher[tuple[Mapping_, Claims]] = BackgroundRefresher(
            "pod-resources", self._fetch, ({}, {}), refresh_s, start=start
        )

    def _fetch(self) -> tuple[Mapping_, Claims]:
        assignments = self._client.list(self._prefixes)
        claims = {normalize_device_id(a.device_id): a.claim for a in assignments if a.claim is not None}
        return build_mapping(assignments), claims

    def refresh(self) -> bool:
        """One List now, on the calling thread; True when it succeeded."""
        return self._refresher.refresh()

    def lookup(self, gpu_uuid: str) -> PodRef | None:
        """The one container holding this GPU or MIG device; None when unknown or shared."""
        owners = self._refresher.value[0].get(normalize_device_id(gpu_uuid), ())
        return owners[0] if len(owners) == 1 else None

    def lookup_all(self, gpu_uuid: str) -> tuple[PodRef, ...]:
        """Every container holding this device (several when the GPU is time-sliced)."""
        return self._refresher.value[0].get(normalize_device_id(gpu_uuid), ())

    def claim(self, device_id: str) -> Claim | None:
        """The DRA claim a device came from (a DRA device name: ``gpu-0``)."""
        return self._refresher.value[1].get(normalize_device_id(device_id))

    def mapping(self) -> dict[str, tuple[PodRef, ...]]:
        """A copy of the current device -> owners mapping."""
        return dict(self._refresher.value[0])

    @property
    def stats(self) -> RefreshStats:
        return self._refresher.stats

    def stop(self) -> None:
        self._refresher.stop()
        self._client.close()
