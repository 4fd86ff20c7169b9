"""When the next scrape of each body is due, learnt from the scrapes that came.

Prometheus scrapes a target at a fixed interval and a fixed phase within it, so once a
few scrapes have come from one client, the next is due one interval after the last.
The cycle that publishes the snapshot that scrape will meet makes the body right after
publishing, in the background: the scrape then costs what any request does. A client
that asked for a body at least BUSY times in the last cycle (scraping back to back, or
faster than the cycle) will ask for the next snapshot's too: it is made the same way,
at no cost its own requests would not have paid. Bodies no one scrapes are never made;
a client whose scrapes come irregularly and seldom is served as before, rendering on
its request.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict, deque

KEEP = 4  # arrivals per client and body: three intervals
STEADY = 0.1  # the intervals may differ by this share of their median
MISSED = 3  # periods without a scrape after which a client is no longer expected
CLIENTS = 16  # (client, body) pairs followed; the least recent is forgotten first
BUSY = 3  # requests for one body in one cycle: a client scraping faster than the cycle


class Cadence:
    def __init__(self) -> None:
        self._seen: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def seen(self, client: str, body: str, at: float) -> None:
        """A scrape of `body` ("openmetrics_gzip", ...) from `client` began at `at` (monotonic)."""
        key = (client, body)
        with self._lock:
            times = self._seen.pop(key, None) or deque(maxlen=KEEP)
            times.append(at)
            self._seen[key] = times
            while len(self._seen) > CLIENTS:
                self._seen.popitem(last=False)

    def due(self, start: float, cycle: float) -> set[str]:
        """The bodies a steady client will scrape from `start` until the next cycle begins
        (with a tenth of a cycle either side: one made twice rather than missed)."""
        margin = 0.1 * cycle
        with self._lock:
            followed = [(body, tuple(times)) for (_, body), times in self._seen.items()]
        out = set()
        for body, times in followed:
            if len(times) >= BUSY and start - cycle <= times[-BUSY] <= times[-1] <= start:  # busy
                out.add(body)
                continue
            nxt = _next(times, start - margin)
            if nxt is not None and nxt < start + cycle + margin:
                out.add(body)
        return out


def _next(times: tuple[float, ...], after: float) -> float | None:
    """The first arrival at or after `after` on a steady client's grid; None if unsteady."""
    if len(times) < 3:
        return None
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    period = gaps[len(gaps) // 2]
    if period <= 0 or gaps[-1] - gaps[0] > STEADY * period:
        return None
    last = times[-1]
    if last >= after:
        return last + period
    if after - last > MISSED * period:
        return None  # the client stopped scraping: make nothing more for it
    skipped = -((last - after) // period)  # whole periods from the last arrival to `after`
    return last + skipped * period
