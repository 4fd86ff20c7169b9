"""The `dcgm_exporter` key of a scenario: a simulated dcgm-exporter and its faults.

    dcgm_exporter:
      interval: 30            # DCGM's sampling window, dcgm-exporter's --collect-interval (s)
      fields: [DCGM_FI_PROF_SM_ACTIVE, ...]   # default: every profiling field read
      hostname_label: Hostname                # or hostname (dcgm-exporter after the rename)
      faults:
        - {kind: stale, at: 300, until: 420}  # values frozen at `at`
        - {kind: slow, at: 10, until: 20, seconds: 5}

Fault kinds: `down` (HTTP 500, dcgm-exporter's answer when DCGM fails), `refused` (the
connection is closed unanswered), `stale` (the page keeps the values of `at`), `huge`
(a body of `bytes`, default 64 MiB), `garbage` (binary bytes), `slow` (answers after
`seconds`), `foreign` (UUIDs of another node's GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from exporter.sim.scenario_input import SECONDS_MAX, number

PROFILING_FIELDS = (
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
)
DCGM_FAULT_KINDS = ("down", "refused", "stale", "huge", "garbage", "slow", "foreign")


@dataclass(frozen=True)
class DcgmFault:
    kind: str
    at: float = 0.0
    until: float = float("inf")
    seconds: float = 5.0  # slow
    bytes: int = 64 * 1024 * 1024  # huge

    def active(self, t: float) -> bool:
        return self.at <= t < self.until


@dataclass(frozen=True)
class DcgmExporterSpec:
    interval_s: float = 30.0
    fields: tuple[str, ...] = PROFILING_FIELDS
    hostname_label: str = "Hostname"
    faults: tuple[DcgmFault, ...] = ()


def parse_spec(raw: Any) -> DcgmExporterSpec:
    """The spec from the YAML value; ValueError names what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError("must be a mapping (interval, fields, hostname_label, faults)")
    unknown = set(raw) - {"interval", "fields", "hostname_label", "faults"}
    if unknown:
        raise ValueError(f"has unknown keys {sorted(unknown)}")
    interval = number(
        raw.get("interval", 30.0), partial(ValueError, "interval must be seconds from 0.1 to 3600"), 0.1, 3600
    )
    fields = tuple(raw.get("fields", PROFILING_FIELDS))
    bad = [f for f in fields if f not in PROFILING_FIELDS]
    if bad:
        raise ValueError(f"fields must be among {', '.join(PROFILING_FIELDS)}; got {bad}")
    host = raw.get("hostname_label", "Hostname")
    if host not in ("Hostname", "hostname"):
        raise ValueError("hostname_label must be Hostname or hostname")
    faults = []
    for i, f in enumerate(raw.get("faults") or []):
        if not isinstance(f, dict) or f.get("kind") not in DCGM_FAULT_KINDS:
            raise ValueError(f"faults[{i}].kind must be one of {', '.join(DCGM_FAULT_KINDS)}")
        when = partial(
            ValueError, f"faults[{i}].at/until must be seconds up to {SECONDS_MAX:g} with until > at"
        )
        at, until = number(f.get("at", 0), when, hi=SECONDS_MAX), f.get("until", float("inf"))
        until = until if until == float("inf") else number(until, when, hi=SECONDS_MAX)
        if until <= at:
            raise when()
        wrong = partial(
            ValueError, f"faults[{i}]: seconds must be 0 to 3600, bytes an integer from 0 to 1 GiB"
        )
        faults.append(
            DcgmFault(
                kind=str(f["kind"]),
                at=at,
                until=until,
                seconds=number(f.get("seconds", 5.0), wrong, hi=3600),
                bytes=int(number(f.get("bytes", 64 * 1024 * 1024), wrong, hi=1024**3, integer=True)),
            )
        )
    return DcgmExporterSpec(interval, fields, str(host), tuple(faults))
