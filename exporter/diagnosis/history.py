"""A bounded ring buffer of frames, keyed on snapshot time, and the arithmetic over it.

All time arithmetic uses `Frame.taken_at` (scenario time in a simulation), never the wall
clock. Counters turn into rates over a window, as Prometheus' rate() does over a range:
each sample at the time it was read (an engine's counters at its scrape, which several
frames may repeat), from the newest sample at least a window old to the newest one, a
counter that went down (a restart) counted from zero.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import TypeVar

from exporter.diagnosis.frame import EngineFrame, Frame, GpuFrame

T = TypeVar("T")
V = TypeVar("V")
Getter = Callable[[T], float | None]
Series = list[tuple[float, float]]


DENSE_S = 120.0  # frames this recent are all kept: rates and hold times need them
SPARSE_STEP_S = 10.0  # older frames, kept for trends and the page's charts, are this far apart


class History:
    """Frames of the last `span_s` seconds, oldest first: every frame of the last two
    minutes, one every ten seconds before that (a 72-GPU frame is ~50 KiB)."""

    def __init__(self, span_s: float, max_frames: int = 8192) -> None:
        self.span_s = span_s
        self.max_frames = max_frames
        self._frames: list[Frame] = []
        self._times: list[float] = []

    def add(self, frame: Frame) -> None:
        if self._times and frame.taken_at < self._times[-1]:
            self.clear()  # time went backwards: a new run (simulation restart)
        if self._times and frame.taken_at == self._times[-1]:
            self._frames.pop()
            self._times.pop()
        self._frames.append(frame)
        self._times.append(frame.taken_at)
        self._thin(frame.taken_at - DENSE_S)
        drop = bisect.bisect_left(self._times, frame.taken_at - self.span_s)
        drop = max(drop, len(self._frames) - self.max_frames)
        if drop > 0:
            del self._frames[:drop]
            del self._times[:drop]

    def _thin(self, boundary: float) -> None:
        """Drop frames that left the dense window too close to the frame before them."""
        i = bisect.bisect_left(self._times, boundary) - 1
        while i >= 1:
            if self._times[i] - self._times[i - 1] >= SPARSE_STEP_S:
                break
            del self._frames[i]
            del self._times[i]
            i -= 1

    def clear(self) -> None:
        self._frames.clear()
        self._times.clear()

    def __len__(self) -> int:
        return len(self._frames)

    def __iter__(self) -> Iterator[Frame]:
        return iter(self._frames)

    @property
    def latest(self) -> Frame | None:
        return self._frames[-1] if self._frames else None

    @property
    def oldest(self) -> Frame | None:
        return self._frames[0] if self._frames else None

    def since(self, seconds: float) -> list[Frame]:
        """Frames taken in the last `seconds` before the latest one (inclusive)."""
        if not self._frames:
            return []
        return self._frames[bisect.bisect_left(self._times, self._times[-1] - seconds) :]

    def after(self, t: float) -> list[Frame]:
        """Frames taken after time `t`."""
        return self._frames[bisect.bisect_right(self._times, t) :]

    def at_or_before(self, t: float) -> list[Frame]:
        """Frames taken at or before `t`, newest last."""
        return self._frames[: bisect.bisect_right(self._times, t)]

    # ---- series ---------------------------------------------------------------------

    def gpu_series(
        self, index: int, get: Getter[GpuFrame], seconds: float | None = None
    ) -> list[tuple[float, float]]:
        frames = self.since(seconds) if seconds is not None else self._frames
        out = []
        for f in frames:
            g = f.gpu(index)
            if g is None:
                continue
            v = get(g)
            if v is not None:
                out.append((f.taken_at, float(v)))
        return out

    def engine_series(
        self, target: str, get: Getter[EngineFrame], seconds: float | None = None
    ) -> list[tuple[float, float]]:
        frames = self.since(seconds) if seconds is not None else self._frames
        out = []
        for f in frames:
            e = f.engine(target)
            if e is None:
                continue
            v = get(e)
            if v is not None:
                out.append((f.taken_at, float(v)))
        return out

    def points(self, get: Callable[[Frame], tuple[float, float] | None], window: float) -> Series:
        """One series' (time, value) samples, oldest first, reaching back to the newest one
        at least `window` before the newest (or to the oldest kept): what a windowed rate
        reads. A sample several frames carry (an engine scraped less often than frames are
        made) counts once, at its own time."""
        out: Series = []
        for f in reversed(self._frames):
            p = get(f)
            if p is None or (out and p[0] >= out[-1][0]):
                continue
            out.append(p)
            if p[0] <= out[0][0] - window:
                break
        out.reverse()
        return out

    def engine_rate(self, target: str, get: Getter[EngineFrame], window: float) -> float | None:
        """Per-second growth of an engine counter over `window`, at its scrape times."""

        def point(f: Frame) -> tuple[float, float] | None:
            e = f.engine(target)
            v = get(e) if e is not None and e.up else None
            if e is None or v is None:
                return None
            return (e.scraped_at if e.scraped_at is not None else f.taken_at, float(v))

        return rate(self.points(point, window))

    def gpu_points(self, index: int, get: Getter[GpuFrame], window: float) -> Series:
        """A GPU counter's samples over `window` (and the one before it), at frame times."""

        def point(f: Frame) -> tuple[float, float] | None:
            g = f.gpu(index)
            v = get(g) if g is not None and g.up else None
            return None if v is None else (f.taken_at, float(v))

        return self.points(point, window)

    def gpu_rate(self, index: int, get: Getter[GpuFrame], window: float) -> float | None:
        """Per-second growth of a GPU counter over `window`."""
        return rate(self.gpu_points(index, get, window))

    def last_gpu(self, index: int, get: Callable[[GpuFrame], V | None], at: float | None = None) -> V | None:
        """The last value known at time `at` (default: now), looking back through frames."""
        end = len(self._frames) if at is None else bisect.bisect_right(self._times, at)
        for i in range(end - 1, -1, -1):
            g = self._frames[i].gpu(index)
            v = get(g) if g is not None else None
            if v is not None:
                return v
        return None


# ---- arithmetic over (time, value) series ------------------------------------------


def increase(series: list[tuple[float, float]], since: float | None = None, baseline: float = 0.0) -> float:
    """How much a counter grew in the series, resets counted from zero.

    With `since`, the growth after that time: the last point at or before `since` is the
    starting value; without such a point the counter is taken to start at `baseline`
    (the exporter counts some counters, XIDs for one, from zero at its own start).
    """
    if not series:
        return 0.0
    start = baseline
    points = series
    if since is not None:
        before = [p for p in series if p[0] <= since]
        if before:
            start = before[-1][1]
        points = [p for p in series if p[0] > since]
    total = 0.0
    prev = start
    for _, v in points:
        total += v - prev if v >= prev else v
        prev = v
    return total


def rate(series: list[tuple[float, float]]) -> float | None:
    """Per-second growth of a counter over the series; None under two points."""
    if len(series) < 2:
        return None
    span = series[-1][0] - series[0][0]
    if span <= 0:
        return None
    return increase(series[1:], baseline=series[0][1]) / span


def slope(series: list[tuple[float, float]]) -> float | None:
    """Least-squares slope (units per second); None under three points or no span."""
    if len(series) < 3:
        return None
    n = len(series)
    mt = sum(t for t, _ in series) / n
    mv = sum(v for _, v in series) / n
    var = sum((t - mt) ** 2 for t, _ in series)
    if var <= 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in series) / var


def downsample(series: list[tuple[float, float]], points: int) -> list[tuple[float, float]]:
    """At most `points` points, each the mean of its bucket, the last point kept as is."""
    if len(series) <= points or points < 2:
        return list(series)
    out = []
    size = len(series) / points
    for i in range(points - 1):
        bucket = series[int(i * size) : int((i + 1) * size)]
        if bucket:
            out.append((bucket[-1][0], sum(v for _, v in bucket) / len(bucket)))
    out.append(series[-1])
    return out
