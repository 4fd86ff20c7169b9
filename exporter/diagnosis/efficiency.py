"""What serving costs: energy per generated token and cost per million tokens, per engine.

Both come from counters over one window (`rate_window_s`), measured at the engine's own
scrape times: the energy its GPUs used between two scrapes of its generation-token
counter (NVML's energy counter, interpolated between snapshots to those instants) over
the tokens generated between them. The first of the two is the newest scrape at least
the window before the last one (as for every windowed rate, history.py), so an engine
scraped less often than the window still has the figures. The cost is the configured price per GPU-hour times
the engine's GPUs times the same span, over the same tokens.

Each is absent rather than guessed where the window has no generated token, where a GPU
of the engine is down or reports no energy counter, and where the GPUs are not the
engine's alone (another engine on one of them, or MIG slices): a whole GPU's energy and
price cannot be split between tenants honestly.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from exporter.diagnosis.frame import EngineFrame, Frame
from exporter.diagnosis.history import History, increase
from exporter.diagnosis.model import EngineEfficiency

Series = list[tuple[float, float]]


@dataclass(frozen=True)
class Efficiency:
    """The figures of one engine over one window; None where they cannot be known."""

    energy_per_token_joules: float | None = None
    cost_per_million_tokens: float | None = None
    tokens: float | None = None  # generated in the span
    span_s: float | None = None


def exclusive_gpus(frame: Frame, e: EngineFrame) -> bool:
    """True when every GPU of the engine is its alone: no other engine, no MIG slices."""
    if not e.gpus:
        return False
    for i in e.gpus:
        g = frame.gpu(i)
        if g is None or g.mig_enabled:
            return False
        if any(o.target != e.target and i in o.gpus for o in frame.engines):
            return False
    return True


def interpolate(series: Series, t: float) -> float | None:
    """The series' value at t, linear between its points; None outside them."""
    if not series or t < series[0][0] or t > series[-1][0]:
        return None
    for (t0, v0), (t1, v1) in pairwise(series):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return series[-1][1]


def efficiency(
    frame: Frame, history: History, e: EngineFrame, window_s: float, gpu_hour_price: float | None
) -> Efficiency:
    """Energy per token and cost per million tokens of engine `e` over the last `window_s`."""
    if not e.up or not exclusive_gpus(frame, e):
        return Efficiency()
    tokens = history.points(lambda f: _token_point(f.engine(e.target)), window_s)
    if len(tokens) < 2:
        return Efficiency()
    energy: Series = []
    # the frames from the last one at or before the first scrape: the energy at both scrapes
    for f in (*history.at_or_before(tokens[0][0])[-1:], *history.after(tokens[0][0])):
        gpus = [f.gpu(i) for i in e.gpus]
        joules = [g.energy_joules_total for g in gpus if g is not None and g.up]
        if len(joules) == len(e.gpus) and all(j is not None for j in joules):
            energy.append((f.taken_at, sum(j for j in joules if j is not None)))
    if len(energy) < 2:
        return Efficiency()
    inside = [p for p in tokens if energy[0][0] <= p[0] <= energy[-1][0]]
    if len(inside) < 2:
        return Efficiency()
    (t0, _), (t1, _) = inside[0], inside[-1]
    generated = increase(inside[1:], baseline=inside[0][1])
    e0, e1 = interpolate(energy, t0), interpolate(energy, t1)
    if generated <= 0 or t1 <= t0 or e0 is None or e1 is None:
        return Efficiency(tokens=generated, span_s=t1 - t0)
    # an energy counter that went back (a driver reload) says nothing about the span
    per_token = (e1 - e0) / generated if e1 >= e0 else None
    cost = None
    if gpu_hour_price is not None:
        cost = gpu_hour_price * len(e.gpus) * (t1 - t0) / 3600.0 / generated * 1e6
    return Efficiency(per_token, cost, generated, t1 - t0)


def _token_point(x: EngineFrame | None) -> tuple[float, float] | None:
    """(scrape time, generation-token counter) of a frame's engine, where it was read."""
    if x is None or not x.up or x.scraped_at is None or x.generation_tokens_total is None:
        return None
    return (x.scraped_at, x.generation_tokens_total)


def efficiencies(
    frame: Frame, history: History, window_s: float, gpu_hour_price: float | None
) -> dict[str, Efficiency]:
    """Every engine's figures by target."""
    return {e.target: efficiency(frame, history, e, window_s, gpu_hour_price) for e in frame.engines}


def reading(target: str, eff: Efficiency) -> EngineEfficiency:
    return EngineEfficiency(
        target=target,
        energy_per_token_joules=eff.energy_per_token_joules,
        cost_per_million_tokens=eff.cost_per_million_tokens,
    )
