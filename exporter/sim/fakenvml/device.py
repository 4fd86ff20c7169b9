# mypy: disable-error-code="no-any-return"
"""The fake NVML library's device area: library init, versions, counts and handles, and
each GPU's identity (name, UUID, PCI address, NUMA placement, persistence mode).

The host's sysfs is part of the story: `write_sysfs` lays out the PCI devices' NUMA nodes
and the nodes' CPU lists that the exporter reads beside NVML.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

import pynvml as N

from exporter.sim.fakenvml.abi import (
    ERROR_CODES,
    HANDLE_BASE,
    MIG_HANDLE_BASE,
    OK,
    Library,
    address,
    mig_slot,
    out,
    set_pointer,
    symbol,
    val,
)
from exporter.sim.scenario import Scenario

# ---- placement ---------------------------------------------------------------------------


def gpu_uuids(scn: Scenario) -> list[str]:
    """A recording's UUIDs, else ones made from the scenario's name (stable across runs)."""
    return list(scn.uuids) or [
        f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{scn.name}/{i}')}" for i in range(scn.gpu_count)
    ]


def bus_id(scn: Scenario, gpu: int) -> str:
    if scn.pci_bus_ids:
        return scn.pci_bus_ids[gpu]
    return f"00000000:{0x18 + gpu * 0x10:02X}:00.0"


def cpu_node(scn: Scenario, gpu: int) -> int:
    """The NUMA node of the CPUs a GPU hangs off: two sockets split the GPUs; on Grace
    each GPU has a CPU node of its own."""
    if scn.profile.part.grace:
        return gpu
    return 0 if gpu < max(1, scn.gpu_count // 2) else 1


def gpu_memory_node(scn: Scenario, gpu: int) -> int:
    """On Grace, the node of the GPU's own memory, which has no CPUs."""
    return scn.gpu_count + gpu


def write_sysfs(scn: Scenario) -> str:
    """The sysfs a host with these GPUs has: each GPU's PCI NUMA node and the CPU list
    of every node. Two CPU sockets split the GPUs; on Grace each GPU has a Grace CPU
    node of its own and its memory is a further node with no CPUs."""
    root = Path(tempfile.mkdtemp(prefix="fakenvml-sysfs-"))
    count = scn.gpu_count
    grace = scn.profile.part.grace
    for node in range(count if grace else 2):
        d = root / "devices/system/node" / f"node{node}"
        d.mkdir(parents=True)
        d.joinpath("cpulist").write_text(f"{node * 64}-{node * 64 + 63}\n")
    if grace:
        for gpu in range(count):
            d = root / "devices/system/node" / f"node{gpu_memory_node(scn, gpu)}"
            d.mkdir(parents=True)
            d.joinpath("cpulist").write_text("\n")  # memory only
    for gpu in range(count):
        d = root / "bus/pci/devices" / bus_id(scn, gpu)[4:].lower()
        d.mkdir(parents=True)
        d.joinpath("numa_node").write_text(f"{cpu_node(scn, gpu)}\n")
    return str(root)


# ---- library ---------------------------------------------------------------------------------


@symbol("nvmlInitWithFlags")
def init_with_flags(lib: Library, flags: Any) -> int:
    return OK


@symbol("nvmlShutdown")
def shutdown(lib: Library) -> int:
    return OK


@symbol("nvmlErrorString", status=False)
def error_string(lib: Library, code: Any) -> bytes:
    for name, c in ERROR_CODES.items():
        if c == val(code):
            return name.encode()
    return b"Unknown Error"


@symbol("nvmlSystemGetDriverVersion")
def driver_version(lib: Library, buf: Any, size: Any) -> int:
    buf.value = lib.profile.driver.version.encode()
    return OK


@symbol("nvmlSystemGetNVMLVersion")
def nvml_version(lib: Library, buf: Any, size: Any) -> int:
    # NVML's own version is the CUDA major version before the driver's ("12.580.65.06")
    buf.value = f"{lib.profile.driver.cuda // 1000}.{lib.profile.driver.version}".encode()
    return OK


@symbol("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2")
def cuda_driver_version(lib: Library, ref: Any) -> int:
    out(ref).value = lib.profile.driver.cuda
    return OK


@symbol("nvmlDeviceGetCount_v2", first="none")
def count(lib: Library, ref: Any) -> int:
    out(ref).value = lib.scn.gpu_count
    return OK


@symbol("nvmlDeviceGetHandleByIndex_v2", first="index")
def handle_by_index(lib: Library, index: Any, ref: Any) -> int:
    i = val(index)
    if not 0 <= i < lib.scn.gpu_count:
        return N.NVML_ERROR_INVALID_ARGUMENT
    set_pointer(ref, HANDLE_BASE + i)
    return OK


# ---- identity ----------------------------------------------------------------------------------


@symbol("nvmlDeviceGetName")
def name(lib: Library, h: Any, buf: Any, size: Any) -> int:
    buf.value = lib.model.name.encode()
    return OK


@symbol("nvmlDeviceGetUUID")
def device_uuid(lib: Library, h: Any, buf: Any, size: Any) -> int:
    addr = address(h)
    if addr >= MIG_HANDLE_BASE:
        gpu, slot = mig_slot(addr)
        buf.value = f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'{lib.scn.name}/{gpu}/{slot}')}".encode()
    else:
        buf.value = lib.uuids[lib.gpu_of(h)].encode()
    return OK


@symbol("nvmlDeviceGetPciInfo_v3")
def pci_info(lib: Library, h: Any, ref: Any) -> int:
    bus = bus_id(lib.scn, lib.gpu_of(h))
    info = out(ref)
    info.busId = bus.encode()
    info.busIdLegacy = info.busId[4:]
    info.bus = int(bus.split(":")[1], 16)
    info.pciDeviceId = 0x233010DE
    return OK


@symbol("nvmlDeviceGetNumaNodeId")
def numa_node_id(lib: Library, h: Any, ref: Any) -> int:
    g = lib.gpu_of(h)
    # On Grace the node of the GPU's own memory, which has no CPUs.
    grace = lib.profile.part.grace
    out(ref).value = gpu_memory_node(lib.scn, g) if grace else cpu_node(lib.scn, g)
    return OK


@symbol("nvmlDeviceGetMemoryAffinity")
def memory_affinity(lib: Library, h: Any, size: Any, ref: Any, scope: Any) -> int:
    # A bit per NUMA node close to the GPU's memory: the node of the CPUs it hangs off.
    node = cpu_node(lib.scn, lib.gpu_of(h))
    words = out(ref)
    if node // 64 >= val(size):
        return N.NVML_ERROR_INSUFFICIENT_SIZE
    words[node // 64] = 1 << (node % 64)
    return OK


@symbol("nvmlDeviceGetPersistenceMode")
def persistence_mode(lib: Library, h: Any, ref: Any) -> int:
    out(ref).value = 1
    return OK
