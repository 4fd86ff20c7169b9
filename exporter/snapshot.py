"""The immutable picture of a node at one instant: what every reader works from."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from exporter.gpu_readings import DeviceFacts
from exporter.metricdef import counter, gauge, info, label, nested

R = TypeVar("R")


@dataclass(frozen=True)
class CallErrors:
    """NVML calls of one function that failed alone, by error name."""

    function: str = label()
    errors: dict[str, int] | None = counter(
        "llmgpu_exporter_nvml_call_errors_total",
        "NVML calls that failed on their own, by function and error name: their values are "
        "absent and the GPU stays up (NoPermission, InvalidArgument for a link a part lacks)",
        label="error",
    )


@dataclass(frozen=True)
class CollectorStatus:
    """Self-metrics of one collector, the node_exporter way."""

    collector: str = label()
    success: int | None = gauge(
        "llmgpu_exporter_collector_success", "1 when the collector's last run reported no error"
    )
    duration_seconds: float | None = gauge(
        "llmgpu_exporter_collector_duration_seconds", "Wall time of the collector's last run"
    )
    sample_age_seconds: float | None = gauge(
        "llmgpu_exporter_collector_sample_age_seconds", "Seconds since the collector's last completed run"
    )
    runs: int | None = counter("llmgpu_exporter_collector_runs_total", "Completed collector runs")
    errors: dict[str, int] | None = counter(
        "llmgpu_exporter_collector_errors_total",
        "Errors by name (NVML error names such as GpuIsLost, or the exception type)",
        label="error",
    )
    calls: tuple[CallErrors, ...] = nested(CallErrors)


@dataclass(frozen=True)
class GpuUp:
    up: int | None = gauge(
        "llmgpu_gpu_up", "1 while every collector could read the GPU on its last run, 0 once one could not"
    )
    supported: dict[str, int] | None = gauge(
        "llmgpu_gpu_metric_supported",
        "1 when the GPU provides the metric family, 0 when it does not (its series are then absent)",
        label="family",
        profile="full",
    )


@dataclass(frozen=True)
class ExporterInfo:
    build: dict[str, str] | None = info("llmgpu_exporter_build_info", "Exporter version and Python version")
    simulated: int | None = gauge(
        "llmgpu_exporter_simulated", "1 when GPUs and engines come from the built-in simulator"
    )
    cycle_seconds: float | None = gauge(
        "llmgpu_exporter_cycle_duration_seconds",
        "Time to compose and diagnose the last snapshot; its bytes are made when a scrape asks",
    )
    scrapes: int | None = counter("llmgpu_exporter_scrapes_total", "Requests served on /metrics")
    auth_failures: dict[str, int] | None = counter(
        "llmgpu_exporter_auth_failures_total",
        "Requests refused by the web config (bad password, missing client certificate)",
        label="reason",
    )


@dataclass(frozen=True)
class Simulation:
    """Where a simulated run is in its scenario: a node reading the page and JSON show, so a
    demo says what it plays and how far it is (exports no metric)."""

    scenario: str
    phase: str
    scenario_seconds: float  # scenario time now
    duration_seconds: float  # the story's length; the values hold after it
    speed: float  # scenario seconds per wall second
    started_at: float  # wall-clock time the scenario started (epoch seconds)
    library_cpu_seconds: float = 0.0  # CPU the fake NVML library spent answering calls

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "phase": self.phase,
            "scenario_seconds": round(self.scenario_seconds, 3),
            "duration_seconds": self.duration_seconds,
            "progress": round(min(1.0, self.scenario_seconds / self.duration_seconds), 4)
            if self.duration_seconds
            else 1.0,
            "speed": self.speed,
            "started_at": self.started_at,
            "library_cpu_seconds": round(self.library_cpu_seconds, 6),
        }


@dataclass(frozen=True)
class GpuState:
    index: int
    uuid: str
    up: bool
    readings: Mapping[type, object] = field(default_factory=dict)
    supported: Mapping[str, bool] = field(default_factory=dict)
    attribution: Mapping[str, str] = field(default_factory=dict)  # namespace, pod, container

    def get(self, cls: type[R]) -> R | None:
        value = self.readings.get(cls)
        return value  # type: ignore[return-value]

    @property
    def facts(self) -> DeviceFacts | None:
        return self.get(DeviceFacts)

    @property
    def base_labels(self) -> tuple[tuple[str, str], ...]:
        return (("gpu", str(self.index)), ("uuid", self.uuid), *self.attribution.items())


@dataclass(frozen=True)
class Snapshot:
    taken_at: float
    gpus: tuple[GpuState, ...] = ()
    # Node-level readings (engines, allocator probes, diagnosis) by class; a class may
    # have several readings (one per engine target), so each entry is a tuple.
    node: Mapping[type, tuple[object, ...]] = field(default_factory=dict)
    collectors: tuple[CollectorStatus, ...] = ()
    simulated: bool = False

    def get(self, cls: type[R]) -> R | None:
        """The node reading of a class, or the first one when there are several."""
        found = self.node.get(cls, ())
        return found[0] if found else None  # type: ignore[return-value]

    def all(self, cls: type[R]) -> tuple[R, ...]:
        """Every node reading of a class."""
        return self.node.get(cls, ())  # type: ignore[return-value]

    def with_node(self, readings: tuple[object, ...]) -> Snapshot:
        """A copy with readings added; a class given here replaces what it had."""
        if not readings:
            return self
        added: dict[type, list[object]] = {}
        for r in readings:
            added.setdefault(type(r), []).append(r)
        node = {**self.node, **{k: tuple(v) for k, v in added.items()}}
        return dataclasses.replace(self, node=node)

    def gpu(self, index: int) -> GpuState | None:
        return next((g for g in self.gpus if g.index == index), None)

    def gpu_by_uuid(self, uuid: str) -> GpuState | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)
