"""The diagnosis rules: one module per layer, one decorated function per rule.

Each rule is a pure function of (frame, history, thresholds) that yields one
`Candidate` per subject whose condition holds now; `@rule(...)` above it declares its
id, severity, scope, hold and clear times, title, condition and advice. The Diagnoser
turns candidates into findings once they held for the hold time. Rules never look at
the wall clock: every time span comes from `Frame.taken_at`. Importing this package
imports every layer module, in the order the page and the docs show the layers.
"""

from __future__ import annotations

from exporter.diagnosis.rules import (  # noqa: F401  (importing a layer declares its rules)
    capacity,
    decoding,
    hardware,
    kernel,
    memory,
    parallel,
    scheduling,
)
from exporter.diagnosis.rules.base import registered, rule
from exporter.diagnosis.rules.capacity import knee_point

RULES = registered()
RULES_BY_ID = {r.id: r for r in RULES}

__all__ = ["RULES", "RULES_BY_ID", "knee_point", "rule"]
