"""How much of a sampling pass is the fake NVML library's own work.

The simulator's library answers in Python where libnvidia-ml answers in C, so CPU
measured on it overstates what the same collectors cost on a real driver. To separate
the two, `Recorder` captures the exact calls (function and ctypes arguments) one pass
makes into the fake, and `replay_seconds` runs that sequence again directly on the
fake's functions: what pynvml and the exporter add on top is not in the replay, so
the replay's CPU is the fake's share of the pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pynvml

# Blocking waits are recorded (counted) but never replayed.
NOT_REPLAYED = frozenset({"nvmlEventSetWait_v2", "nvmlEventSetWait", "nvmlErrorString"})

Call = tuple[str, Callable[..., Any], tuple[Any, ...]]


def _entry_points(lib: Any) -> dict[str, Callable[..., Any]]:
    return {name: fn for name, fn in vars(lib).items() if name.startswith("nvml") and callable(fn)}


class Recorder:
    """Context manager: every call into the fake library inside the block is kept."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.calls: list[Call] = []
        self._originals: dict[str, Callable[..., Any]] = {}

    def __enter__(self) -> Recorder:
        self._originals = _entry_points(self.lib)
        for name, fn in self._originals.items():
            setattr(self.lib, name, self._recording(name, fn))
        with pynvml.libLoadLock:  # pynvml caches the functions it looked up
            pynvml._nvmlGetFunctionPointer_cache.clear()
        return self

    def __exit__(self, *exc: object) -> None:
        for name, fn in self._originals.items():
            setattr(self.lib, name, fn)
        with pynvml.libLoadLock:
            pynvml._nvmlGetFunctionPointer_cache.clear()

    def _recording(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.calls.append((name, fn, args))
            return fn(*args)

        return call


def replay_seconds(calls: list[Call], passes: int) -> float:
    """CPU seconds one replay of `calls` takes on the fake, averaged over `passes`."""
    todo = [(fn, args) for name, fn, args in calls if name not in NOT_REPLAYED]
    if not todo or passes <= 0:
        return 0.0
    start = time.process_time()
    for _ in range(passes):
        for fn, args in todo:
            fn(*args)
    return (time.process_time() - start) / passes
