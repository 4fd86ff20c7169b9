"""XID critical errors, caught on a thread of their own that waits on NVML events.

The event set belongs to one NVML session: when the driver goes away the thread stops
waiting until the session is rebuilt (`Nvml.recover`, on the GPU collectors' thread),
then registers again on the new one; the counts carry on.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

from exporter.collectors.base import Collector, Context, Output, register
from exporter.gpu_readings import Xid
from exporter.nvml import RELOADED, Nvml, NvmlError, decode
from exporter.nvml import const as N

log = logging.getLogger(__name__)

# Started at zero so the first occurrence is an increase, not a new series: the ones an
# operator acts on (13 graphics exception, 31 MMU fault, 43 reset channel, 48 DBE,
# 63/64 row remap, 74 NVLink, 79 fallen off the bus, 92/94/95 ECC events).
KNOWN_XIDS = (13, 31, 43, 48, 63, 64, 74, 79, 92, 94, 95)
WAIT_MS = 1000


class XidCollector(Collector):
    name = "xid"

    def __init__(self, ctx: Context) -> None:
        assert ctx.nvml is not None
        self.nvml: Nvml = ctx.nvml
        self.interval_s = ctx.settings.interval
        self._counts: dict[int, Counter[int]] = {}
        self._errors: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._register_lock = threading.Lock()
        self._registered = False
        self._by_uuid: dict[str, int] = {}
        self._generation = self.nvml.generation  # the session the event set was made in

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="xid-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the event thread; returns once it is done (within one event wait)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=WAIT_MS / 1000 + 5.0)

    def _register(self) -> bool:
        """Create the event set once per NVML session; GPUs that take the registration
        start at zero the first time."""
        with self._register_lock:
            if self._generation != self.nvml.generation:  # the old set died with its session
                self._generation, self._registered, self._event_set = self.nvml.generation, False, None
            if not self._registered:
                self._registered = True
                self._register_all()
        return bool(self._counts)

    def _register_all(self) -> None:
        self._event_set = self.nvml.query(N.nvmlEventSetCreate)
        if self._event_set is None:
            return
        for index in range(self.nvml.count):
            try:
                h = self.nvml.handle(index)
                if not self.nvml.supported(
                    N.nvmlDeviceRegisterEvents, h, N.nvmlEventTypeXidCriticalError, self._event_set
                ):
                    continue
                uuid = self.nvml.query(N.nvmlDeviceGetUUID, h)
            except NvmlError as err:
                self._count_error(err.name)
                continue
            with self._lock:
                if uuid:
                    self._by_uuid[decode(uuid)] = index
                self._counts.setdefault(index, Counter({x: 0 for x in KNOWN_XIDS}))

    def _run(self) -> None:
        try:
            if not self._register():
                log.info("XID events are not supported here; XID counters stay absent")
                return
        except NvmlError as err:
            self._count_error(err.name)
            return
        while not self._stop.is_set():
            if self.nvml.lost is not None:  # parked while the session is rebuilt
                self._stop.wait(1.0)
                continue
            try:
                self._register()
            except NvmlError as err:
                self._count_error(err.name)
            if self._take(WAIT_MS) == "failed":
                self._stop.wait(1.0)  # a broken event set: do not spin

    def _take(self, timeout_ms: int) -> str:
        """Wait for one event and count it: 'event', 'none' (timed out) or 'failed'."""
        if self._event_set is None:
            return "failed"
        try:
            data = self.nvml.blocking(N.nvmlEventSetWait_v2, self._event_set, timeout_ms)
        except NvmlError as err:
            if err.name == "Timeout":
                return "none"
            if err.name in RELOADED:
                self.nvml.session_lost(err.name)
            self._count_error(err.name)
            return "failed"
        if data is None:
            return "failed"
        index = self._index_of(data.device)
        if index is None:
            self._count_error("unmapped")
            log.warning("XID %d from a device no GPU index is known for", data.eventData)
        else:
            self.record(index, int(data.eventData))
            log.warning("GPU %d reported XID %d", index, data.eventData)
        return "event"

    def _index_of(self, device: Any) -> int | None:
        """The GPU an event came from. Its handle need not be one handed out by index (an
        XID inside a GPU instance carries the MIG device's handle): then by the parent's
        handle, then by UUID."""
        index = self.nvml.index_of(device)
        for ask in (self._by_parent, self._by_device_uuid):
            if index is not None:
                break
            try:
                index = ask(device)
            except NvmlError:
                continue
        return index

    def _by_parent(self, device: Any) -> int | None:
        parent = self.nvml.query(N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, device)
        return None if parent is None else self.nvml.index_of(parent)

    def _by_device_uuid(self, device: Any) -> int | None:
        uuid = self.nvml.query(N.nvmlDeviceGetUUID, device)
        with self._lock:
            return self._by_uuid.get(decode(uuid)) if uuid else None

    def refresh(self) -> None:
        """Stepped runs have no event thread: take every waiting event without blocking."""
        if self.nvml.lost is not None:
            return
        try:
            if not self._register():
                return
        except NvmlError as err:
            self._count_error(err.name)
            return
        while self._take(0) == "event":
            pass

    def _count_error(self, name: str) -> None:
        with self._lock:
            self._errors[name] += 1

    def collect(self) -> Output:
        try:
            self._register()
        except NvmlError as err:
            self._count_error(err.name)
        with self._lock:
            gpus: dict[int, tuple[object, ...]] = {i: (Xid(counts=dict(c)),) for i, c in self._counts.items()}
            errors, self._errors = dict(self._errors), Counter()
        return Output(gpus=gpus, errors=errors)

    def record(self, index: int, xid: int) -> None:
        """Count one XID event on a GPU."""
        with self._lock:
            self._counts.setdefault(index, Counter())[xid] += 1


@register("xid", "XID critical errors from NVML events (own thread)", nvml=True)
def _factory(ctx: Context) -> XidCollector:
    return XidCollector(ctx)
