"""A background thread that refreshes a cached value and keeps the last good one on errors."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RefreshStats:
    """Counters of one refresher, for the exporter's self-metrics."""

    refreshes_total: int
    errors_total: int
    last_error: str | None
    last_success_unix_seconds: float | None
    last_duration_seconds: float | None


class BackgroundRefresher(Generic[T]):
    """Calls ``fetch`` every ``refresh_s`` seconds on a daemon thread.

    Readers get the last value that was fetched without error; a failing fetch is
    counted and logged (once per distinct message) and leaves that value in place.
    """

    def __init__(
        self,
        name: str,
        fetch: Callable[[], T],
        initial: T,
        refresh_s: float,
        *,
        start: bool = True,
    ) -> None:
        if refresh_s <= 0:
            raise ValueError(f"refresh_s must be positive, got {refresh_s!r}")
        self._name = name
        self._fetch = fetch
        self._value = initial
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._refreshes = 0
        self._errors = 0
        self._last_error: str | None = None
        self._last_success: float | None = None
        self._last_duration: float | None = None
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    def start(self) -> None:
        """Start the refresh thread (idempotent)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def refresh(self) -> bool:
        """Fetch once, now, on the calling thread; True when it succeeded."""
        began = time.monotonic()
        try:
            value = self._fetch()
        except Exception as exc:  # every failure is counted, none stops the thread
            message = f"{type(exc).__name__}: {exc}"
            with self._lock:
                self._refreshes += 1
                self._errors += 1
                repeated = message == self._last_error
                self._last_error = message
                self._last_duration = time.monotonic() - began
            if not repeated:
                log.warning("%s refresh failed: %s", self._name, message)
            return False
        with self._lock:
            self._value = value
            self._refreshes += 1
            self._last_error = None
            self._last_success = time.time()
            self._last_duration = time.monotonic() - began
        return True

    @property
    def value(self) -> T:
        with self._lock:
            return self._value

    @property
    def stats(self) -> RefreshStats:
        with self._lock:
            return RefreshStats(
                refreshes_total=self._refreshes,
                errors_total=self._errors,
                last_error=self._last_error,
                last_success_unix_seconds=self._last_success,
                last_duration_seconds=self._last_duration,
            )

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the thread to end and wait for it."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self._refresh_s)
