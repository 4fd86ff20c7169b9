"""The owner labels of processes (cgroup -> pod list) and GPUs (pod resources)."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from exporter.k8s.owners import Owners, PodLabels, label_name
from exporter.k8s.podresources import Claim, PodRef
from exporter.k8s.pods import PodInfo

UID = "0b5ef4e2-1111-2222-3333-444455556666"
CID = "a" * 64
POD = PodInfo(
    namespace="llm",
    name="chat-0",
    uid=UID,
    pod_ip=None,
    annotations=MappingProxyType({}),
    containers=(("engine", CID),),
    labels=MappingProxyType({"app.kubernetes.io/name": "vllm", "team": "search", "pod-template-hash": "x"}),
)


class Pods:
    def __init__(self, pods: list[PodInfo]) -> None:
        self.listed: list[PodInfo] = []
        self.later = pods
        self.refreshes = 0

    def refresh(self) -> bool:
        self.refreshes += 1
        self.listed = self.later
        return True

    def by_uid(self, uid: str) -> PodInfo | None:
        return next((p for p in self.listed if p.uid == uid), None)

    def by_name(self, namespace: str, name: str) -> PodInfo | None:
        return next((p for p in self.listed if (p.namespace, p.name) == (namespace, name)), None)


class Devices:
    def lookup(self, device: str) -> PodRef | None:
        known = {"gpu-1": PodRef("llm", "chat-0", "engine"), "gpu-aaaa": PodRef("x", "y", "z")}
        return known.get(device.lower())

    def claim(self, device: str) -> Claim | None:
        return Claim("chat-gpu", "llm", "gpu.nvidia.com", "n", "gpu-1") if device == "gpu-1" else None

    def refresh(self) -> bool:
        return True


def proc(tmp_path: Path, pid: int, line: str) -> str:
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "cgroup").write_text(line)
    return str(tmp_path)


def test_a_process_is_named_by_its_cgroup_and_a_new_pod_lists_again(tmp_path: Path) -> None:
    root = proc(tmp_path, 42, f"0::/kubepods/burstable/pod{UID}/{CID}\n")
    pods = Pods([POD])
    t = [0.0]
    owners = Owners(pods=pods, labels=PodLabels("team|app.*", 8), proc_root=root, clock=lambda: t[0])
    assert owners.process(42) == (
        ("namespace", "llm"),
        ("pod", "chat-0"),
        ("container", "engine"),
        ("label_app_kubernetes_io_name", "vllm"),
        ("label_team", "search"),
    )
    assert pods.refreshes == 1  # the pod was not listed yet: listed once, on the miss
    assert owners.process(7) == ()  # no such process
    pods.later = []
    pods.listed = []
    assert owners.process(42) == ()  # the pod ended: no owner, and no second list within 5 s
    assert pods.refreshes == 1
    t[0] = 6.0
    owners.process(42)
    assert pods.refreshes == 2


def test_a_dra_gpu_gets_its_claim_and_pod_labels() -> None:
    pods = Pods([POD])
    pods.refresh()
    owners = Owners(pods=pods, devices=Devices(), labels=PodLabels("team", 8))
    assert owners.gpu(1, "GPU-bbbb") == {
        "namespace": "llm",
        "pod": "chat-0",
        "container": "engine",
        "claim": "chat-gpu",
        "label_team": "search",
    }
    assert owners.gpu(0, "GPU-aaaa")["pod"] == "y"  # a device plugin's GPU, by its UUID
    assert owners.gpu(2, "GPU-cccc") == {}


def test_pod_labels_are_bounded_and_named_as_label_names() -> None:
    assert label_name("app.kubernetes.io/name") == "label_app_kubernetes_io_name"
    assert PodLabels(".*", 2).of(POD) == (
        ("label_app_kubernetes_io_name", "vllm"),
        ("label_pod_template_hash", "x"),
    )
    assert PodLabels(None, 8).of(POD) == ()
    assert PodLabels(".*", 0).of(POD) == ()
