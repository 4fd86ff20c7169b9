"""Numbers as a person reads them: 93 %, 71.2 GiB, 2.1 GB/s, 4 min 10 s."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def value_text(value: float | str | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return "∞" if value > 0 else "n/a"
    if unit == "ratio":
        return percent(value)
    if unit == "id":  # a pid, a NUMA node, an index: the number itself, never "4.0 M"
        return str(int(value))
    if unit == "bytes":
        return _binary(value)
    if unit == "bytes_per_second":
        return _decimal(value, "B/s")
    if unit == "seconds":
        return duration(value)
    if unit == "per_second":
        return f"{_short(value)}/s"
    if unit == "celsius":
        return f"{value:.0f} °C"
    if unit == "watts":
        return f"{value:.0f} W"
    if unit == "joules":  # energy per token is a fraction of a joule
        return f"{value:.3g} J" if value >= 0.01 else f"{value * 1000:.3g} mJ"
    return _short(value)


def percent(value: float) -> str:
    """Whole percent, with one decimal under 10 % and where rounding would claim 0 or 100 %.

    The one place ratios become text, so a score and the evidence behind it read alike.
    """
    pct = value * 100
    whole = f"{pct:.0f}"
    if value == 0 or (abs(pct) >= 10 and whole not in ("100", "-100")) or abs(value) >= 1:
        return f"{whole} %"
    return f"{pct:.1f} %"


def _short(v: float) -> str:
    if v == int(v) and abs(v) < 1e6:
        return str(int(v))
    if abs(v) >= 1e6:
        return _decimal(v, "")
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _binary(v: float) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(v) >= size:
            return f"{v / size:.1f} {unit}"
    return f"{v:.0f} B"


def _decimal(v: float, suffix: str) -> str:
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= size:
            return f"{v / size:.1f} {unit}{suffix}".rstrip()
    return f"{v:.0f} {suffix}".rstrip()


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, sec = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {sec} s" if sec else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def simulation_line(s: Mapping[str, Any]) -> str:
    """'scenario kv-pressure, phase long-prompts: 4 min 10 s of 10 min (42 %), at 10x'."""
    t, total = float(s.get("scenario_seconds", 0.0)), float(s.get("duration_seconds", 0.0))
    ended = " (ended: its last values hold)" if total and t >= total else ""
    return (
        f"scenario {s.get('scenario')}, phase {s.get('phase')}: {duration(t)} of {duration(total)} "
        f"({float(s.get('progress', 0.0)) * 100:.0f} %){ended}, at {float(s.get('speed', 1.0)):g}x"
    )
