"""Times and durations as a person types them: RFC3339, unix seconds, `now`, `now-1h`."""

from __future__ import annotations

import re
from datetime import datetime

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


class TimeError(ValueError):
    pass


def duration(text: str) -> float:
    """`90`, `90s`, `1m30s`, `2h` -> seconds."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise TimeError(f"{text!r} is not a duration (e.g. 30s, 5m, 1h30m)")
    return total


def moment(text: str, now: float) -> float:
    """`now`, `now-1h`, unix seconds or RFC3339 (`2024-05-01T12:00:00Z`) -> unix seconds."""
    text = text.strip()
    if text == "now":
        return now
    if text.startswith("now-"):
        return now - duration(text[4:])
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise TimeError(
            f"{text!r} is not a time: give RFC3339 (2024-05-01T12:00:00Z), unix seconds, now or now-1h"
        ) from None
    if parsed.tzinfo is None:
        raise TimeError(f"{text!r} has no time zone: add Z or an offset such as +02:00")
    return parsed.timestamp()
