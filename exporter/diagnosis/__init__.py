"""Six-layer diagnosis: rules over a snapshot and a short history, an OOM-risk score.

`Diagnoser` is the enricher the runner calls with each snapshot; `rules.RULES` is the
rule table, `thresholds.Thresholds` every number the rules compare against.
"""

from __future__ import annotations

from exporter.diagnosis.diagnoser import Diagnoser
from exporter.diagnosis.model import Diagnosis, Finding, FindingStates, OomRisk, OomRiskRatios
from exporter.diagnosis.thresholds import Thresholds

__all__ = ["Diagnoser", "Diagnosis", "Finding", "FindingStates", "OomRisk", "OomRiskRatios", "Thresholds"]
