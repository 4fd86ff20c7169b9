"""Who owns each GPU and each GPU process on this node, as the labels their series carry.

* A process: its cgroup names its pod UID and container id (``cgroup.py``; the pids are
  NVML's, so the exporter needs the host's pid namespace), and this node's pod list from
  the API server (``pods.py``) names the pod, its container and its labels.
* A GPU: the kubelet's pod-resources API (``podresources.py``) names the one container a
  device plugin gave it, or the container and claim a DRA driver allocated it. A GPU
  handed out as time-sliced or MPS replicas (``<uuid>::<n>``) to several pods has no
  single owner: each pod's part of it is its processes'.

Pod labels are copied only where an allow-list (a regular expression on the label's
key) picks them, at most `max_labels` of them in the order of their keys, named the way
kube-state-metrics names them (``label_<key with _ for every other character>``), so that
no series carries more labels than a store takes.

Nothing here is cached beyond what the two watchers hold: a process or pod that ends is
gone from the next cycle's series.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping

from exporter.k8s.cgroup import pod_uid_and_container_id
from exporter.k8s.pods import PodInfo

Labels = tuple[tuple[str, str], ...]
MISS_REFRESH_S = 5.0  # a pod UID the pod list does not know yet refreshes it at most this often
_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")


def label_name(key: str) -> str:
    """A pod label's key as a label name: `app.kubernetes.io/name` -> `label_app_kubernetes_io_name`."""
    return "label_" + _LABEL_CHARS.sub("_", key)


class PodLabels:
    """The pod labels an allow-list copies onto series."""

    def __init__(self, allow: str | None, max_labels: int) -> None:
        self._allow = re.compile(allow) if allow else None
        self._max = max_labels

    def of(self, pod: PodInfo | None) -> Labels:
        if pod is None or self._allow is None or self._max == 0:
            return ()
        picked = sorted(k for k in pod.labels if self._allow.fullmatch(k))[: self._max]
        return tuple((label_name(k), pod.labels[k]) for k in picked)


class Owners:
    """The owner labels of processes and GPUs, from the watchers the exporter keeps."""

    def __init__(
        self,
        *,
        pods: object | None = None,  # a NodePodsWatcher (duck-typed: by_uid, by_name, refresh)
        devices: object | None = None,  # a PodResourcesWatcher (lookup, claim)
        labels: PodLabels | None = None,
        proc_root: str = "/proc",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pods = pods
        self._devices = devices
        self._labels = labels or PodLabels(None, 0)
        self._proc_root = proc_root
        self._clock = clock
        self._last_miss_refresh = -MISS_REFRESH_S
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Both lists now, on the calling thread (stepped runs, before each cycle)."""
        for watcher in (self._devices, self._pods):
            if watcher is not None:
                watcher.refresh()  # type: ignore[attr-defined]

    def _pod(self, uid: str) -> PodInfo | None:
        pods = self._pods
        if pods is None:
            return None
        pod: PodInfo | None = pods.by_uid(uid)  # type: ignore[attr-defined]
        if pod is None:  # a pod newer than the list: list again, not more often than MISS_REFRESH_S
            with self._lock:
                now = self._clock()
                due = now - self._last_miss_refresh >= MISS_REFRESH_S
                if due:
                    self._last_miss_refresh = now
            if due:
                pods.refresh()  # type: ignore[attr-defined]
                pod = pods.by_uid(uid)  # type: ignore[attr-defined]
        return pod

    def process(self, pid: int) -> Labels:
        """namespace, pod, container and the allowed pod labels of a process; () when unknown."""
        uid, container_id = pod_uid_and_container_id(pid, self._proc_root)
        if uid is None:
            return ()
        pod = self._pod(uid)
        if pod is None:
            return ()
        container = (pod.container_name(container_id) if container_id else None) or ""
        return (
            ("namespace", pod.namespace),
            ("pod", pod.name),
            ("container", container),
            *self._labels.of(pod),
        )

    def gpu(self, index: int, uuid: str) -> Mapping[str, str]:
        """The labels of a GPU with one owner (a whole GPU, a MIG device, a DRA claim)."""
        devices = self._devices
        if devices is None:
            return {}
        ref = devices.lookup(uuid)  # type: ignore[attr-defined]
        claim = None
        if ref is None:  # a DRA device: by NVIDIA's driver's name for it
            dra = f"gpu-{index}"
            ref = devices.lookup(dra)  # type: ignore[attr-defined]
            claim = devices.claim(dra) if ref is not None else None  # type: ignore[attr-defined]
        if ref is None:
            return {}
        out = {"namespace": ref.namespace, "pod": ref.pod, "container": ref.container}
        if claim is not None:
            out["claim"] = claim.name
        pods = self._pods
        if pods is not None:
            out.update(self._labels.of(pods.by_name(ref.namespace, ref.pod)))  # type: ignore[attr-defined]
        return out
