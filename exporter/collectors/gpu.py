"""Shared loop of the per-GPU NVML collectors: one GPU failing never stops the others,
and one function failing never stops the GPU.

A read goes through `query`, `field_values` and `query_versioned` here, which keep a
failed function's values absent and count its error by name; `held` keeps a value that
changes only on an admin's or a link's doing (power limit, link width, BAR1 size) for
HELD_S between reads, a quarter of the NVML calls of a cycle. Only a failure of the GPU
itself (a DEVICE_GONE error, no handle, a handle that no longer resolves, or every call
of the read failing) marks the GPU down for this collector and drops its handle and
per-GPU state. Each call that failed alone is counted by function and error name.

An error saying the driver went away (RELOADED: unloaded, reloaded, upgraded) is about
every GPU and the whole session: every GPU is down, and each run asks `Nvml.recover` to
rebuild the session (with a backoff) before it reads; once rebuilt, every collector
starts afresh on the new session (`reset`), so the GPUs come back by themselves.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from exporter.collectors.base import Collector, Context, Output
from exporter.metricdef import has_value
from exporter.nvml import DEVICE_GONE, INVALID_ARGUMENT, RELOADED, UNANSWERED, Nvml, NvmlError
from exporter.nvml import const as N

log = logging.getLogger(__name__)
HELD_S = 10.0  # collector-clock seconds a `held` value is kept before it is read again


class GpuCollector(Collector):
    """Subclasses set `name`, `default_interval` and implement `read()` for one GPU.

    `forget(index)` drops what a subclass keeps per GPU once the GPU stopped answering,
    so a GPU that comes back starts afresh.
    """

    name = ""
    default_interval = 1.0  # in multiples of Settings.interval when `follows_interval`
    follows_interval = True

    def __init__(self, ctx: Context) -> None:
        assert ctx.nvml is not None
        self.nvml: Nvml = ctx.nvml
        base = ctx.settings.interval
        self.interval_s = base * self.default_interval if self.follows_interval else self.default_interval
        self._clock = ctx.clock
        self._calls = 0
        self._failed: Counter[str] = Counter()
        self._failed_calls: Counter[tuple[str, str]] = Counter()  # (function, error) this run
        self._logged: set[tuple[str, str]] = set()
        self._held: dict[tuple[int, str], tuple[float, Any]] = {}  # (GPU, what) -> (read at, value)
        self._generation = self.nvml.generation  # the NVML session this collector's state is of

    def read(self, index: int, handle: Any) -> object | None:
        raise NotImplementedError

    def forget(self, index: int) -> None:
        """Drop per-GPU state; nothing for collectors that keep none."""

    def reset(self) -> None:
        """Start afresh on a new NVML session: every GPU's state, and what a collector keeps
        about the driver (subclasses extend this)."""
        for index in range(self.nvml.count):
            self.forget(index)
        self._held.clear()

    # ---- calls that fail alone -----------------------------------------------------------

    def _guard(self, call: Callable[[], Any]) -> Any:
        self._calls += 1
        try:
            return call()
        except NvmlError as err:
            if err.name in DEVICE_GONE:
                raise
            self.failed(err)
            return None

    def failed(self, err: NvmlError) -> None:
        """Count a call that failed alone (for reads that handle an error themselves)."""
        self._failed[err.name] += 1
        self._failed_calls[(err.function, err.name)] += 1
        if (err.function, err.name) not in self._logged:
            self._logged.add((err.function, err.name))
            # InvalidArgument here is a link or counter the part lacks: an answer, not a fault
            level = logging.INFO if err.name == INVALID_ARGUMENT else logging.WARNING
            log.log(level, "%s: %s failed (%s); its values stay absent", self.name, err.function, err.name)

    def query(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`Nvml.query`, with a function-level error turned into an absent value."""
        return self._guard(lambda: self.nvml.query(fn, *args))

    def field_values(self, handle: Any, ids: list[tuple[int, int]]) -> dict[tuple[int, int], float]:
        return self._guard(lambda: self.nvml.field_values(handle, ids)) or {}

    def query_versioned(self, key: str, variants: list[Callable[[], Any]]) -> Any:
        return self._guard(lambda: self.nvml.query_versioned(key, variants))

    def mig_devices(self, h: Any) -> Iterator[Any]:
        """The MIG device handles under a parent; an empty slot answers NotFound."""
        for slot in range(self.query(N.nvmlDeviceGetMaxMigDeviceCount, h) or 0):
            try:
                mh = self.nvml.query(N.nvmlDeviceGetMigDeviceHandleByIndex, h, slot)
            except NvmlError as err:
                if err.name != "NotFound":
                    self.failed(err)
                continue
            if mh is not None:
                yield mh

    def held(self, index: int, what: str, read: Callable[[], Any]) -> Any:
        """What `read()` gave less than HELD_S ago on this GPU, else what it gives now."""
        now = self._clock()
        kept = self._held.get((index, what))
        if kept is not None and 0.0 <= now - kept[0] < HELD_S:
            return kept[1]
        value = read()
        self._held[(index, what)] = (now, value)
        return value

    def _unanswered(self) -> str | None:
        """The error of a GPU that answered none of this read's calls (two at least: one
        function failing alone is not a GPU failing), or None."""
        dead = sum(n for name, n in self._failed.items() if name in UNANSWERED)
        if self._calls >= 2 and dead == self._calls:
            return self._failed.most_common(1)[0][0]
        return None

    # ---- the loop ------------------------------------------------------------------------

    def collect(self) -> Output:
        gpus: dict[int, tuple[object, ...]] = {}
        gpu_errors: dict[int, str] = {}
        unsupported: dict[int, tuple[str, ...]] = {}
        errors: Counter[str] = Counter()
        calls: Counter[tuple[str, str]] = Counter()
        if not self.nvml.recover(self._clock()):
            lost = self.nvml.lost or "Uninitialized"
            return Output(gpu_errors=dict.fromkeys(range(self.nvml.count), lost), errors={lost: 1})
        if self._generation != self.nvml.generation:
            self._generation = self.nvml.generation
            self.reset()
        for index in range(self.nvml.count):
            self._calls, self._failed, self._failed_calls = 0, Counter(), Counter()
            try:
                reading, down = self._read(index)
            except NvmlError as err:  # RELOADED: the whole session is gone, not this GPU
                errors[err.name] += 1
                self.nvml.session_lost(err.name)
                gpu_errors.update(dict.fromkeys(range(index, self.nvml.count), err.name))
                break
            errors.update(self._failed)
            if down is not None:
                gpu_errors[index] = down
                self.nvml.forget(index)
                self.forget(index)
                self._held = {k: v for k, v in self._held.items() if k[0] != index}
                continue
            calls.update(self._failed_calls)  # a GPU that is down failed, not its calls
            if reading is not None and has_value(reading):
                gpus[index] = (reading,)
            elif not self._failed:  # nothing failed: the GPU does not have it
                unsupported[index] = (self.name,)
        return Output(
            gpus=gpus,
            gpu_errors=gpu_errors,
            errors=dict(errors),
            unsupported=unsupported,
            call_errors=dict(calls),
        )

    def _read(self, index: int) -> tuple[object | None, str | None]:
        """One GPU's reading, and the error that says the GPU itself failed (or None)."""
        try:
            h = self.nvml.handle(index)
        except NvmlError as err:
            if err.name in RELOADED:
                raise
            self._failed[err.name] += 1
            return None, err.name
        reading = None
        try:
            reading = self.read(index, h)
        except NvmlError as err:  # a call the read did not guard
            if err.name in RELOADED:
                raise
            if err.name in DEVICE_GONE:
                self._failed[err.name] += 1
                return None, err.name
            self.failed(err)
        if INVALID_ARGUMENT in self._failed:
            if not self.nvml.resolves(index, h):
                # A stale handle, not an argument the part lacks: one failure, of the GPU.
                self._failed = Counter({INVALID_ARGUMENT: 1})
                return None, INVALID_ARGUMENT
            # A link or counter the part lacks: an answer about that call, counted with the
            # calls (call_errors), not a failure of the collector.
            del self._failed[INVALID_ARGUMENT]
        return reading, self._unanswered()
