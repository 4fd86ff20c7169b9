"""The diagnosis: rules over a snapshot and a short history, and an OOM-risk score.

Seven layers: six where a request stalls (hardware, kernel, memory, scheduling,
parallel, decoding) and capacity, for a node that is simply full. `Diagnoser` is the
enricher the runner calls with each snapshot; `rules/<layer>.py` declare the rules
(`rules.RULES` lists them), `thresholds.Thresholds` holds every number they compare against.
"""

from __future__ import annotations

from exporter.diagnosis.diagnoser import Diagnoser
from exporter.diagnosis.model import Diagnosis, Finding, FindingStates, OomRisk, OomRiskRatios
from exporter.diagnosis.thresholds import Thresholds

__all__ = ["Diagnoser", "Diagnosis", "Finding", "FindingStates", "OomRisk", "OomRiskRatios", "Thresholds"]
