"""Bytes made from a snapshot once, on the first request that wants them.

/metrics is rendered by the runner every cycle whether scraped or not; the JSON API and
the page are rendered here instead, lazily: the first request for a snapshot renders it
(off the event loop, under a lock so that concurrent requests render once) and every
later request for the same snapshot gets the same bytes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from exporter.snapshot import Snapshot

T = TypeVar("T")


class PerSnapshot(Generic[T]):
    def __init__(self, render: Callable[[Snapshot], T]) -> None:
        self._render = render
        self._lock = threading.Lock()
        self._cached: tuple[Snapshot, T] | None = None
        self.renders = 0

    async def get(self, snapshot: Snapshot) -> T:
        cached = self._cached  # one read: a tuple swapped whole, never half-updated
        if cached is not None and cached[0] is snapshot:
            return cached[1]
        return await asyncio.to_thread(self._make, snapshot)

    def _make(self, snapshot: Snapshot) -> T:
        with self._lock:
            cached = self._cached
            if cached is not None and cached[0] is snapshot:
                return cached[1]  # made by the request that held the lock before us
            value = self._render(snapshot)
            self.renders += 1
            self._cached = (snapshot, value)
            return value
