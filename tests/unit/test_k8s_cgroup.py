"""Pod UID and container id from canned /proc/<pid>/cgroup files."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.k8s.cgroup import parse_cgroup_file, parse_cgroup_path, pod_uid_and_container_id

UID = "0f8a2b3c-4d5e-4f60-8a7b-9c0d1e2f3a4b"
US = UID.replace("-", "_")
CID = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899"

# One canned file per runtime, cgroup version and driver, as real nodes write them.
CANNED: dict[str, str] = {
    "v2-systemd-containerd": (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{US}.slice/cri-containerd-{CID}.scope\n"
    ),
    "v2-systemd-containerd-guaranteed": (
        f"0::/kubepods.slice/kubepods-pod{US}.slice/cri-containerd-{CID}.scope\n"
    ),
    "v2-systemd-crio-nested": (
        "0::/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{US}.slice/crio-{CID}.scope/container\n"
    ),
    "v2-cgroupfs-containerd": f"0::/kubepods/burstable/pod{UID}/{CID}\n",
    "v2-cgroup-namespace": (f"0::/../../kubepods-besteffort-pod{US}.slice/cri-containerd-{CID}.scope\n"),
    "v2-systemd-docker": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{US}.slice/docker-{CID}.scope\n"
    ),
    "v1-cgroupfs-docker": (
        f"12:pids:/kubepods/besteffort/pod{UID}/{CID}\n"
        f"11:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
        f"4:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{CID}\n"
        f"1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n"
        "0::/\n"
    ),
    "v1-systemd-crio": (
        "13:hugetlb:/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{US}.slice/crio-{CID}.scope\n"
        "12:memory:/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{US}.slice/crio-{CID}.scope\n"
        "1:name=systemd:/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{US}.slice/crio-{CID}.scope\n"
    ),
    "v1-systemd-containerd-guaranteed": (
        f"10:devices:/kubepods.slice/kubepods-pod{US}.slice/cri-containerd-{CID}.scope\n"
        f"9:memory:/kubepods.slice/kubepods-pod{US}.slice/cri-containerd-{CID}.scope\n"
    ),
}


@pytest.mark.parametrize("name", sorted(CANNED))
def test_kubernetes_cgroups(name: str) -> None:
    assert parse_cgroup_file(CANNED[name]) == (UID, CID)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"0::/system.slice/docker-{CID}.scope\n", (None, CID)),  # plain Docker, no pod
        (f"0::/machine.slice/libpod-{CID}.scope\n", (None, CID)),  # Podman
        ("0::/user.slice/user-1000.slice/session-3.scope\n", (None, None)),
        ("0::/\n", (None, None)),
        ("", (None, None)),
        ("garbage without colons\n", (None, None)),
        # conmon, CRI-O's monitor, is not the container
        (
            "0::/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{US}.slice/crio-conmon-{CID}.scope\n",
            (UID, None),
        ),
        # the pod's own cgroup (a process directly in the pod, e.g. during setup)
        (f"0::/kubepods/burstable/pod{UID}\n", (UID, None)),
    ],
)
def test_other_cgroups(text: str, expected: tuple[str | None, str | None]) -> None:
    assert parse_cgroup_file(text) == expected


def test_static_pod_uid_without_dashes() -> None:
    static = "5d41402abc4b2a76b9719d911017c592"
    assert parse_cgroup_path(f"/kubepods/burstable/pod{static}/{CID}") == (static, CID)


def test_container_id_above_the_pod_is_ignored() -> None:
    assert parse_cgroup_path(f"/docker-{CID}.scope/kubepods/pod{UID}") == (UID, None)


def test_reads_proc_tree(tmp_path: Path) -> None:
    for pid, name in enumerate(sorted(CANNED), start=100):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(CANNED[name])
        assert pod_uid_and_container_id(pid, proc_root=str(tmp_path)) == (UID, CID)


def test_missing_process(tmp_path: Path) -> None:
    assert pod_uid_and_container_id(4242, proc_root=str(tmp_path)) == (None, None)


def test_own_process_does_not_crash() -> None:
    uid, cid = pod_uid_and_container_id(1)
    assert uid is None or len(uid.replace("-", "")) == 32
    assert cid is None or len(cid) == 64
