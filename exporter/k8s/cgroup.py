"""The pod UID and container id of a process, from ``/proc/<pid>/cgroup``.

Handles cgroup v1 and v2, the kubelet's systemd and cgroupfs drivers, and the
containerd, CRI-O and Docker runtimes. Examples of the paths it reads::

    0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope
    0::/kubepods/besteffort/pod<uid>/<id>
    11:memory:/kubepods/pod<uid>/<id>
    0::/kubepods.slice/kubepods-pod<uid_>.slice/crio-<id>.scope/container
    0::/../../kubepods-besteffort-pod<uid_>.slice/cri-containerd-<id>.scope  (cgroup namespace)
    0::/system.slice/docker-<id>.scope  (Docker, no pod)

The systemd driver writes the UID with ``_`` for ``-``; it comes back with dashes.
Container ids come back bare (64 hex digits, no ``containerd://`` scheme).
"""

from __future__ import annotations

import os
import re

_UID = r"[0-9a-f]{8}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{12}"
_POD_COMPONENT = re.compile(rf"^(?:kubepods(?:-[a-z]+)*-)?pod(?P<uid>{_UID})(?:\.slice)?$")
_CONTAINER_COMPONENT = re.compile(
    r"^(?:(?:cri-containerd|containerd|crio|docker|libpod)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$"
)


def parse_cgroup_path(path: str) -> tuple[str | None, str | None]:
    """``(pod_uid, container_id)`` from one cgroup path; either may be None."""
    pod_uid: str | None = None
    container_id: str | None = None
    for component in path.lower().split("/"):
        pod = _POD_COMPONENT.match(component)
        if pod is not None:
            # the systemd driver writes the UID with "_"; static pods have 32 hex digits
            pod_uid = pod.group("uid").replace("_", "-")
            container_id = None  # a container id counts only below its pod
            continue
        container = _CONTAINER_COMPONENT.match(component)
        if container is not None:
            container_id = container.group("id")
    return pod_uid, container_id


def parse_cgroup_file(text: str) -> tuple[str | None, str | None]:
    """``(pod_uid, container_id)`` from the contents of a ``/proc/<pid>/cgroup`` file.

    Lines are ``hierarchy-id:controllers:path``; v1 lists one per hierarchy, v2 one
    (``0::``). The first line that names a pod wins; failing that, the first that
    names a container (a plain Docker or Podman container).
    """
    fallback: tuple[str | None, str | None] = (None, None)
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        pod_uid, container_id = parse_cgroup_path(parts[2])
        if pod_uid is not None:
            return pod_uid, container_id
        if container_id is not None and fallback == (None, None):
            fallback = (None, container_id)
    return fallback


def pod_uid_and_container_id(pid: int, proc_root: str = "/proc") -> tuple[str | None, str | None]:
    """``(pod_uid, container_id)`` of a process; ``(None, None)`` if gone or not in a container."""
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup"), encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError):
        return None, None
    return parse_cgroup_file(text)
