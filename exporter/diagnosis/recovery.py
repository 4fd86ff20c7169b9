"""How long engines stay down when they crash or restart, from their up/down samples.

An engine's downtime runs from the first sample that reads it down (its scrape failed)
to the first sample that reads it up again, so it is known to about one engine scrape
interval. Only an engine seen up before counts: one that is down when the exporter
starts, or was never up, has no "last downtime" yet, and one that is still down has
none until it is back (`llmgpu_engine_up` says it is down). The Diagnoser keeps one
`Uptime` per engine and writes it into the frame before the rules run, so the rules
read it like any other number and the history's thinning cannot move its edges.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from exporter.diagnosis.frame import EngineFrame, Frame


@dataclass(frozen=True)
class Uptime:
    seen_up: bool = False
    down_since: float | None = None  # first sample down, after it was up
    last_downtime_s: float | None = None  # the last down episode that ended
    recovered_at: float | None = None  # when that episode ended


def advance(u: Uptime, t: float, up: bool) -> Uptime:
    """The state after one more sample taken at `t`."""
    if up:
        if u.down_since is not None:
            return Uptime(seen_up=True, last_downtime_s=max(0.0, t - u.down_since), recovered_at=t)
        return u if u.seen_up else replace(u, seen_up=True)
    if u.seen_up and u.down_since is None:
        return replace(u, down_since=t)
    return u


def annotate(frame: Frame, uptimes: dict[str, Uptime]) -> Frame:
    """Advance every engine's state by this frame (in place) and write it into the frame.

    Engines that left the frame are forgotten."""
    engines: list[EngineFrame] = []
    for e in frame.engines:
        u = advance(uptimes.get(e.target, Uptime()), frame.taken_at, e.up)
        uptimes[e.target] = u
        engines.append(
            replace(
                e,
                down_since=u.down_since,
                last_downtime_seconds=u.last_downtime_s,
                recovered_at=u.recovered_at,
            )
        )
    for target in [t for t in uptimes if frame.engine(t) is None]:
        del uptimes[target]
    return replace(frame, engines=tuple(engines))
