"""Process ids across pid namespaces, for joining allocator probes to engines.

A probe inside a container reports its pid as the container sees it (often 1 or 7)
together with its pid namespace (`pid:[4026532000]`). The engine scraper knows the
engine's processes by their host pids. `/proc/<host pid>/status` lists the pid in every
namespace the process belongs to (`NSpid: 81234 7`, outermost first) and
`/proc/<host pid>/ns/pid` names the innermost one, so each host pid maps to the
(namespace, pid) pair its own probe reports.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

NsPid = tuple[str, int]  # (pid namespace, pid inside it)


def ns_pid(pid: int, proc: str = "/proc") -> NsPid | None:
    """The innermost (namespace, pid) of a host pid; None when /proc cannot tell."""
    try:
        namespace = os.readlink(f"{proc}/{pid}/ns/pid")
        with open(f"{proc}/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    inner = line.split()[-1]
                    return (namespace, int(inner)) if inner.isdigit() else None
    except (OSError, ValueError):
        return None
    return None


def ns_pids(pids: Iterable[int], proc: str = "/proc") -> frozenset[NsPid]:
    """Every (namespace, pid) pair the given host pids are known by inside their namespace."""
    return frozenset(p for p in (ns_pid(pid, proc) for pid in pids) if p is not None)
