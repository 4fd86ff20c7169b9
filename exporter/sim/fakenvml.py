# mypy: disable-error-code="no-any-return"
# (pynvml is untyped: its constants and ctypes fields read as Any)
"""A fake NVML library that stands where libnvidia-ml.so would, under pynvml.

`install(timeline)` puts a `FakeLibrary` in `pynvml.nvmlLib`: pynvml then calls its
functions with the same ctypes arguments it passes to the real library, and they fill
the same out-parameters and return the same status codes. Everything above pynvml —
the exporter's NVML layer and collectors — runs unchanged. Values come from the
scenario timeline; faults (errors, hangs, lost GPUs, XID events) from its fault list.
How it differs by driver branch and part (missing symbols, refused fields, struct sizes,
NotSupported functions) comes from the scenario's profile (exporter/sim/drivers.py).
"""

from __future__ import annotations

import ctypes
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml as N

from exporter.nvml import (
    FI_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
    FI_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    FI_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    FI_MEMORY_TEMP,
    FI_NVLINK_CRC_DATA_ERROR_COUNT,
    FI_NVLINK_ERROR_DL_CRC,
    FI_NVLINK_ERROR_DL_RECOVERY,
    FI_NVLINK_ERROR_DL_REPLAY,
    FI_NVLINK_GET_STATE,
    FI_NVLINK_LINK_COUNT,
    FI_NVLINK_THROUGHPUT_DATA_RX,
    FI_NVLINK_THROUGHPUT_DATA_TX,
    FI_PCIE_COUNT_RX_BYTES,
    FI_PCIE_COUNT_TX_BYTES,
    FI_PCIE_REPLAY_COUNTER,
    FI_PERF_POLICY_POWER,
    SCOPE_ALL_LINKS,
)
from exporter.sim.drivers import DriverProfile
from exporter.sim.fake_gpm import GpmSamples, _noise
from exporter.sim.fake_handles import (
    ERROR_CODES,
    EVENT_SET,
    HANDLE_BASE,
    MIB,
    MIG_HANDLE_BASE,
    NOT_SUPPORTED,
    OK,
    _address,
    _gpu_at,
    _matches,
    _out,
    _set_pointer,
    _val,
    _without,
)
from exporter.sim.fake_mig import ProcessesAndMig
from exporter.sim.scenario import Scenario, Timeline

THROTTLE_BITS = {
    "throttle_power_cap": N.nvmlClocksEventReasonSwPowerCap,
    "throttle_sw_thermal": N.nvmlClocksEventReasonSwThermalSlowdown,
    "throttle_hw_thermal": N.nvmlClocksEventReasonHwThermalSlowdown,
    "throttle_hw_slowdown": N.nvmlClocksEventReasonHwSlowdown,
    "throttle_power_brake": N.nvmlClocksEventReasonHwPowerBrakeSlowdown,
}
# Field id -> (timeline key integrated, scale): counters are integrals of rates.
THROTTLE_FIELDS = {
    FI_PERF_POLICY_POWER: "throttle_power_cap",
    FI_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: "throttle_sw_thermal",
    FI_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: "throttle_hw_thermal",
    FI_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: "throttle_power_brake",
}
NVLINK_ERROR_FIELDS = {FI_NVLINK_ERROR_DL_REPLAY, FI_NVLINK_ERROR_DL_RECOVERY, FI_NVLINK_ERROR_DL_CRC}


class FakeLibrary(GpmSamples, ProcessesAndMig):
    """Answers pynvml's C calls from a scenario timeline."""

    def __init__(self, timeline: Timeline) -> None:
        self.t = timeline
        self.scn: Scenario = timeline.scenario
        self.model = self.scn.gpu_model
        self.profile: DriverProfile = self.scn.profile
        self._missing = self.profile.driver.missing
        self.sysfs = self._write_sysfs()
        self.uuids = list(self.scn.uuids) or [
            f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{self.scn.name}/{i}')}" for i in range(self.scn.gpu_count)
        ]
        self._gpm_samples: dict[int, tuple[int, float]] = {}  # sample address -> (gpu, time)
        self._next_sample = 0x40_0000
        self._gpm_live: set[int] = set()
        self._xid_seen: set[tuple[int, float]] = set()
        self._events_for: set[int] = set()
        self._lock = threading.Lock()
        self.calls = 0
        self._cpu: dict[int, float] = {}  # thread -> CPU seconds spent answering calls
        self._build_table()

    # ---- plumbing --------------------------------------------------------------------

    def __new__(cls, timeline: Timeline) -> FakeLibrary:
        # pynvml looks symbols up with getattr(nvmlLib, name): a symbol this driver branch
        # does not export must raise AttributeError, which it turns into FunctionNotFound.
        # A subclass per branch hides them, so no other attribute lookup pays for it.
        missing = timeline.scenario.profile.driver.missing
        return object.__new__(_without(cls, missing) if missing else cls)

    def _write_sysfs(self) -> str:
        """The sysfs a host with these GPUs has: each GPU's PCI NUMA node and the CPU list
        of every node. Two CPU sockets split the GPUs; on Grace each GPU has a Grace CPU
        node of its own and its memory is a further node with no CPUs."""
        root = Path(tempfile.mkdtemp(prefix="fakenvml-sysfs-"))
        count = self.scn.gpu_count
        cpu_nodes = count if self.profile.part.grace else 2
        for node in range(cpu_nodes):
            d = root / "devices/system/node" / f"node{node}"
            d.mkdir(parents=True)
            d.joinpath("cpulist").write_text(f"{node * 64}-{node * 64 + 63}\n")
        if self.profile.part.grace:
            for gpu in range(count):
                d = root / "devices/system/node" / f"node{self._gpu_memory_node(gpu)}"
                d.mkdir(parents=True)
                d.joinpath("cpulist").write_text("\n")  # memory only
        for gpu in range(count):
            d = root / "bus/pci/devices" / self._bus_id(gpu)[4:].lower()
            d.mkdir(parents=True)
            d.joinpath("numa_node").write_text(f"{self._cpu_node(gpu)}\n")
        return str(root)

    def _cpu_node(self, gpu: int) -> int:
        if self.profile.part.grace:
            return gpu
        return 0 if gpu < max(1, self.scn.gpu_count // 2) else 1

    def _gpu_memory_node(self, gpu: int) -> int:
        return self.scn.gpu_count + gpu

    def _bus_id(self, gpu: int) -> str:
        if self.scn.pci_bus_ids:
            return self.scn.pci_bus_ids[gpu]
        return f"00000000:{0x18 + gpu * 0x10:02X}:00.0"

    def close(self) -> None:
        shutil.rmtree(self.sysfs, ignore_errors=True)

    def _build_table(self) -> None:
        for name in dir(type(self)):
            if name.startswith("nvml") and name not in self._missing:
                setattr(self, name, self._wrap(name, getattr(self, name)))

    def _wrap(self, name: str, fn: Callable[..., int]) -> Callable[..., Any]:
        takes_handle = name.startswith("nvmlDevice") and name not in BY_INDEX
        faulty = any(f.kind in ("hang", "lost", "error") for f in self.scn.faults)
        refused = any(_matches(f, name) for f in self.profile.part.not_supported)

        def call(*args: Any) -> Any:
            started = time.thread_time()
            try:
                return answer(*args)
            finally:  # per thread: no lock, no lost update
                me = threading.get_ident()
                self._cpu[me] = self._cpu.get(me, 0.0) + time.thread_time() - started

        def answer(*args: Any) -> Any:
            self.calls += 1
            addr = _address(args[0]) if takes_handle and args else None
            if name in BY_INDEX:
                gpu = _val(args[0]) if name.endswith("Index_v2") else None
            else:
                gpu = None if addr is None else _gpu_at(addr, self.scn.gpu_count)
            if takes_handle and gpu == -1:
                return N.NVML_ERROR_INVALID_ARGUMENT  # not a handle this library handed out
            if faulty:
                now = self.t.now()
                for f in self.t.faults("hang", now):
                    if _matches(f.function, name) and (f.gpu is None or f.gpu == gpu):
                        time.sleep(f.seconds)
                if gpu is not None and gpu >= 0:
                    for f in self.t.faults("lost", now):
                        if f.gpu is None or f.gpu == gpu:
                            return ERROR_CODES["GpuIsLost"]
                for f in self.t.faults("error", now):
                    if _matches(f.function, name) and (f.gpu is None or f.gpu == gpu):
                        return ERROR_CODES.get(f.error, ERROR_CODES["Unknown"])
            if refused:
                return NOT_SUPPORTED
            if (
                not self.profile.mig_monitor
                and takes_handle
                and gpu is not None
                and addr is not None
                and addr < MIG_HANDLE_BASE
                and self._mig_on(gpu)
                and any(_matches(f, name) for f in MIG_MONITOR_FUNCTIONS)
            ):
                return N.NVML_ERROR_NO_PERMISSION
            return fn(*args)

        if name == "nvmlErrorString":
            return fn  # pynvml sets restype on it; it returns bytes, not a status
        return call

    @property
    def cpu_seconds(self) -> float:
        """CPU spent answering calls: libnvidia-ml's C work, done here in Python."""
        return sum(self._cpu.values())

    def _gpu_of(self, handle: Any) -> int:
        return _gpu_at(_address(handle), self.scn.gpu_count)

    def v(self, gpu: int, key: str) -> float:
        now = self.t.now()
        return self.t.gpu(gpu, key, now) * (1.0 if self.scn.steady else _noise(now, gpu, key))

    # ---- library -----------------------------------------------------------------------

    def nvmlInitWithFlags(self, flags: Any) -> int:
        return OK

    def nvmlShutdown(self) -> int:
        return OK

    def nvmlErrorString(self, code: Any) -> bytes:
        for name, c in ERROR_CODES.items():
            if c == _val(code):
                return name.encode()
        return b"Unknown Error"

    def nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        buf.value = self.profile.driver.version.encode()
        return OK

    def nvmlSystemGetNVMLVersion(self, buf: Any, size: Any) -> int:
        # NVML's own version is the CUDA major version before the driver's ("12.580.65.06")
        buf.value = f"{self.profile.driver.cuda // 1000}.{self.profile.driver.version}".encode()
        return OK

    def nvmlSystemGetCudaDriverVersion(self, ref: Any) -> int:
        _out(ref).value = self.profile.driver.cuda
        return OK

    def nvmlSystemGetCudaDriverVersion_v2(self, ref: Any) -> int:
        return self.nvmlSystemGetCudaDriverVersion(ref)

    def nvmlDeviceGetCount_v2(self, ref: Any) -> int:
        _out(ref).value = self.scn.gpu_count
        return OK

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> int:
        i = _val(index)
        if not 0 <= i < self.scn.gpu_count:
            return N.NVML_ERROR_INVALID_ARGUMENT
        _set_pointer(ref, HANDLE_BASE + i)
        return OK

    # ---- facts ---------------------------------------------------------------------------

    def nvmlDeviceGetName(self, h: Any, buf: Any, size: Any) -> int:
        buf.value = self.model.name.encode()
        return OK

    def nvmlDeviceGetUUID(self, h: Any, buf: Any, size: Any) -> int:
        addr = _address(h)
        if addr >= MIG_HANDLE_BASE:
            gpu, slot = divmod(addr - MIG_HANDLE_BASE, 16)
            buf.value = f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'{self.scn.name}/{gpu}/{slot}')}".encode()
        else:
            buf.value = self.uuids[self._gpu_of(h)].encode()
        return OK

    def nvmlDeviceGetPciInfo_v3(self, h: Any, ref: Any) -> int:
        gpu = self._gpu_of(h)
        info = _out(ref)
        info.busId = self._bus_id(gpu).encode()
        info.busIdLegacy = info.busId[4:]
        info.bus = int(self._bus_id(gpu).split(":")[1], 16)
        info.pciDeviceId = 0x233010DE
        return OK

    def nvmlDeviceGetNumaNodeId(self, h: Any, ref: Any) -> int:
        g = self._gpu_of(h)
        # On Grace the node of the GPU's own memory, which has no CPUs.
        _out(ref).value = self._gpu_memory_node(g) if self.profile.part.grace else self._cpu_node(g)
        return OK

    def nvmlDeviceGetMemoryAffinity(self, h: Any, size: Any, ref: Any, scope: Any) -> int:
        # A bit per NUMA node close to the GPU's memory: the node of the CPUs it hangs off.
        node = self._cpu_node(self._gpu_of(h))
        words = _out(ref)
        if node // 64 >= _val(size):
            return N.NVML_ERROR_INSUFFICIENT_SIZE
        words[node // 64] = 1 << (node % 64)
        return OK

    def _mig_on(self, gpu: int) -> bool:
        return self.scn.mig is not None and gpu in self.scn.mig.gpus

    def nvmlDeviceGetMigMode(self, h: Any, cur: Any, pending: Any) -> int:
        on = int(self._mig_on(self._gpu_of(h)))
        _out(cur).value = on
        _out(pending).value = on
        return OK

    def nvmlDeviceGetPersistenceMode(self, h: Any, ref: Any) -> int:
        _out(ref).value = 1
        return OK

    def nvmlDeviceGetMaxClockInfo(self, h: Any, kind: Any, ref: Any) -> int:
        hz = (
            self.model.sm_clock_max_hertz
            if _val(kind) == N.NVML_CLOCK_SM
            else self.model.memory_clock_max_hertz
        )
        _out(ref).value = int(hz / 1e6)
        return OK

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: Any, lo: Any, hi: Any) -> int:
        _out(lo).value = int(self.model.power_limit_watts * 1000 * 0.3)
        _out(hi).value = int(self.model.power_limit_watts * 1000)
        return OK

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Any, ref: Any) -> int:
        _out(ref).value = self.model.pcie_generation
        return OK

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Any, ref: Any) -> int:
        _out(ref).value = self.model.pcie_width
        return OK

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Any, ref: Any) -> int:
        trained = round(self.t.gpu(self._gpu_of(h), "pcie_link_gen"))  # 0: at the maximum
        _out(ref).value = trained or self.model.pcie_generation
        return OK

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Any, ref: Any) -> int:
        trained = round(self.t.gpu(self._gpu_of(h), "pcie_link_width"))
        _out(ref).value = trained or self.model.pcie_width
        return OK

    # ---- status --------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, h: Any, ref: Any) -> int:
        g = self._gpu_of(h)
        out = _out(ref)
        out.gpu = min(100, round(self.v(g, "util") * 100))
        out.memory = min(100, round(self.v(g, "mem_busy") * 100))
        return OK

    def _memory(self, g: int) -> tuple[int, int, int]:
        total = self.model.memory_bytes
        reserved = self.model.memory_reserved_bytes
        used = min(total - reserved, round(self.t.gpu(g, "memory_used_ratio") * total))
        return total, reserved, used

    def nvmlDeviceGetMemoryInfo_v2(self, h: Any, ref: Any) -> int:
        if _address(h) >= MIG_HANDLE_BASE:
            return self._mig_memory(h, ref)
        total, reserved, used = self._memory(self._gpu_of(h))
        out = _out(ref)
        out.total, out.reserved, out.used = total, reserved, used
        out.free = total - reserved - used
        return OK

    def nvmlDeviceGetMemoryInfo(self, h: Any, ref: Any) -> int:
        if _address(h) >= MIG_HANDLE_BASE:
            return self._mig_memory(h, ref)
        total, reserved, used = self._memory(self._gpu_of(h))
        out = _out(ref)
        out.total, out.used, out.free = total, used + reserved, total - used - reserved
        return OK

    def nvmlDeviceGetBAR1MemoryInfo(self, h: Any, ref: Any) -> int:
        out = _out(ref)
        out.bar1Total = 128 * 1024 * MIB
        out.bar1Used = 40 * MIB
        out.bar1Free = out.bar1Total - out.bar1Used
        return OK

    def nvmlDeviceGetClockInfo(self, h: Any, kind: Any, ref: Any) -> int:
        g = self._gpu_of(h)
        if _val(kind) == N.NVML_CLOCK_SM:
            hz = self.model.sm_clock_max_hertz * min(1.0, self.t.gpu(g, "sm_clock_ratio"))
        else:
            hz = self.model.memory_clock_max_hertz * min(1.0, self.t.gpu(g, "mem_clock_ratio"))
        _out(ref).value = round(hz / 1e6)  # whole MHz, as the driver answers
        return OK

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Any, ref: Any) -> int:
        """The same mask under its pre-R535 name, exported by every branch."""
        return self._clock_reasons(h, ref)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any, ref: Any) -> int:
        return self._clock_reasons(h, ref)

    def _clock_reasons(self, h: Any, ref: Any) -> int:
        g = self._gpu_of(h)
        bits = 0
        for key, bit in THROTTLE_BITS.items():
            if self.t.gpu(g, key) >= 0.5:
                bits |= bit
        if self.t.gpu(g, "util") < 0.01:
            bits |= N.nvmlClocksEventReasonGpuIdle
        _out(ref).value = bits
        return OK

    def nvmlDeviceGetPowerUsage(self, h: Any, ref: Any) -> int:
        g = self._gpu_of(h)
        _out(ref).value = round(self.v(g, "power_ratio") * self.model.power_limit_watts * 1000)
        return OK

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Any, ref: Any) -> int:
        _out(ref).value = int(self.model.power_limit_watts * 1000)
        return OK

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Any, ref: Any) -> int:
        g = self._gpu_of(h)
        joules = self.t.gpu_integral(g, "power_ratio") * self.model.power_limit_watts
        _out(ref).value = int(joules * 1000)
        return OK

    def nvmlDeviceGetTemperature(self, h: Any, sensor: Any, ref: Any) -> int:
        _out(ref).value = round(self.v(self._gpu_of(h), "temp_c"))
        return OK

    def nvmlDeviceGetFieldValues(self, h: Any, count: Any, ref: Any) -> int:
        g = self._gpu_of(h)
        values = _out(ref)
        for i in range(_val(count)):
            fv = values[i]
            # nvml.h nvmlFieldValue_t.nvmlReturn: each field fails on its own and the call
            # still succeeds. An id newer than the driver is refused like an unknown one.
            if fv.fieldId in self.profile.driver.unknown_fields:
                fv.nvmlReturn = N.NVML_ERROR_INVALID_ARGUMENT
                continue
            value = (
                None
                if fv.fieldId in self.profile.part.fields_not_supported
                else self._field(g, fv.fieldId, fv.scopeId)
            )
            if value is None:
                fv.nvmlReturn = NOT_SUPPORTED
                continue
            fv.nvmlReturn = OK
            fv.valueType = N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            fv.value.ullVal = int(value)
            fv.timestamp = int(time.time() * 1e6)
        return OK

    def _field(self, g: int, fid: int, scope: int) -> float | None:
        t = self.t
        links = self.model.nvlinks
        if fid == FI_PCIE_COUNT_TX_BYTES:
            return t.gpu_integral(g, "pcie_tx_bps")
        if fid == FI_PCIE_COUNT_RX_BYTES:
            return t.gpu_integral(g, "pcie_rx_bps")
        if fid == FI_PCIE_REPLAY_COUNTER:
            return t.gpu_integral(g, "pcie_replay_rate")
        if fid == FI_MEMORY_TEMP:
            return self.v(g, "mem_temp_c")
        if fid in THROTTLE_FIELDS:  # nanoseconds held down
            return t.gpu_integral(g, THROTTLE_FIELDS[fid]) * 1e9
        if fid == FI_NVLINK_LINK_COUNT:
            return links if links else None  # PCIe-only parts refuse the field
        if fid in (FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX):
            if scope >= links and not (scope == SCOPE_ALL_LINKS and links):
                return None
            key = "nvlink_tx_bps" if fid == FI_NVLINK_THROUGHPUT_DATA_TX else "nvlink_rx_bps"
            share = 1 if scope == SCOPE_ALL_LINKS else links  # UINT_MAX: the sum over links
            return t.gpu_integral(g, key) / share / 1024  # KiB
        if fid == FI_NVLINK_GET_STATE:
            return 1 if scope < links else None
        if fid in NVLINK_ERROR_FIELDS:
            if scope >= links:
                return None
            return self._nvlink_errors(g) if fid == FI_NVLINK_ERROR_DL_CRC else 0
        if fid in FI_NVLINK_CRC_DATA_ERROR_COUNT:  # the link is in the id
            return 0 if FI_NVLINK_CRC_DATA_ERROR_COUNT.index(fid) < links else None
        return None

    def _nvlink_errors(self, g: int) -> int:
        """Flit CRC errors of one link: the scenario's rate spread over the links."""
        return int(self.t.gpu_integral(g, "nvlink_error_rate") / max(1, self.model.nvlinks))

    # ---- NVLink, ECC -----------------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, h: Any, link: Any, ref: Any) -> int:
        if _val(link) >= self.model.nvlinks:
            return NOT_SUPPORTED if self.model.nvlinks == 0 else N.NVML_ERROR_INVALID_ARGUMENT
        _out(ref).value = 1
        return OK

    def nvmlDeviceGetNvLinkErrorCounter(self, h: Any, link: Any, counter: Any, ref: Any) -> int:
        g = self._gpu_of(h)
        if _val(link) >= self.model.nvlinks:
            return NOT_SUPPORTED if self.model.nvlinks == 0 else N.NVML_ERROR_INVALID_ARGUMENT
        if _val(counter) == N.NVML_NVLINK_ERROR_DL_CRC_FLIT:
            _out(ref).value = self._nvlink_errors(g)
        else:
            _out(ref).value = 0
        return OK

    def nvmlDeviceGetTotalEccErrors(self, h: Any, kind: Any, counter: Any, ref: Any) -> int:
        g = self._gpu_of(h)
        corrected = _val(kind) == N.NVML_MEMORY_ERROR_TYPE_CORRECTED
        kind = "corrected" if corrected else "uncorrected"
        counted = round(self.t.gpu(g, f"ecc_{kind}_base")) + int(self.t.gpu_integral(g, f"ecc_{kind}_rate"))
        _out(ref).value = counted
        return OK

    def nvmlDeviceGetRemappedRows(self, h: Any, corr: Any, unc: Any, pending: Any, failed: Any) -> int:
        g = self._gpu_of(h)
        # Each uncorrectable error during the scenario remaps a row at the next reset.
        fresh = int(self.t.gpu_integral(g, "ecc_uncorrected_rate"))
        _out(corr).value = round(self.t.gpu(g, "remapped_rows_correctable"))
        _out(unc).value = round(self.t.gpu(g, "remapped_rows_uncorrectable")) + fresh
        _out(pending).value = int(fresh > 0 or self.t.gpu(g, "remap_pending") >= 0.5)
        _out(failed).value = int(self.t.gpu(g, "remap_failed") >= 0.5)
        return OK

    # ---- events ----------------------------------------------------------------------------

    def nvmlEventSetCreate(self, ref: Any) -> int:
        _set_pointer(ref, EVENT_SET)
        return OK

    def nvmlEventSetFree(self, s: Any) -> int:
        return OK

    def nvmlDeviceRegisterEvents(self, h: Any, types: Any, s: Any) -> int:
        self._events_for.add(self._gpu_of(h))
        return OK

    def nvmlEventSetWait_v2(self, s: Any, ref: Any, timeout_ms: Any) -> int:
        deadline = time.monotonic() + _val(timeout_ms) / 1000
        while True:
            # Each XID fires once, as soon as its time has come, however fast time runs.
            now = self.t.now()
            to_come = [
                f
                for f in self.scn.faults
                if f.kind == "xid"
                and (f.gpu or 0, f.at) not in self._xid_seen
                and (f.gpu or 0) in self._events_for
            ]
            for f in (f for f in to_come if f.at <= now):
                gpu = f.gpu or 0
                self._xid_seen.add((gpu, f.at))
                data = _out(ref)
                # An XID inside a GPU instance carries that MIG device's handle.
                address = MIG_HANDLE_BASE + gpu * 16 if self._mig_on(gpu) else HANDLE_BASE + gpu
                data.device = ctypes.cast(ctypes.c_void_p(address), N.c_nvmlDevice_t)
                data.eventType = N.nvmlEventTypeXidCriticalError
                data.eventData = f.xid
                return OK
            if time.monotonic() >= deadline:
                return N.NVML_ERROR_TIMEOUT
            # As a driver blocks in its wait: poll only while an XID is still to come.
            left = max(0.0, deadline - time.monotonic())
            time.sleep(min(0.05, left) if to_come else left)


BY_INDEX = ("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetCount_v2")
# What a MIG parent refuses a container that was given MIG devices without the monitor
# capability (NVIDIA_MIG_MONITOR_DEVICES unset): memory and processes of the whole GPU.
MIG_MONITOR_FUNCTIONS = ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetComputeRunningProcesses")


def installed() -> FakeLibrary:
    """The fake library pynvml is using now."""
    assert isinstance(N.nvmlLib, FakeLibrary), "the fake NVML library is not installed"
    return N.nvmlLib


def install(timeline: Timeline) -> FakeLibrary:
    """Make pynvml load the fake library instead of libnvidia-ml."""
    lib = FakeLibrary(timeline)
    with N.libLoadLock:
        N.nvmlLib = lib
        N._nvmlGetFunctionPointer_cache.clear()
    return lib


def uninstall() -> None:
    with N.libLoadLock:
        if isinstance(N.nvmlLib, FakeLibrary):
            N.nvmlLib.close()
        N.nvmlLib = None
        N._nvmlGetFunctionPointer_cache.clear()
