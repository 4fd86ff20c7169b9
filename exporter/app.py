"""Assembles the exporter from settings: NVML (real or simulated), collectors, runner."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from exporter import collectors
from exporter.collectors.base import Context
from exporter.config import ConfigError, Settings, replace
from exporter.diagnosis.diagnoser import Diagnoser
from exporter.engines.attribution import engine_gpus
from exporter.metricdef import Profile
from exporter.nvml import Nvml
from exporter.runner import Attribution, Enricher, Runner
from exporter.sim import fakenvml
from exporter.sim.dcgm import start_sim_dcgm_exporter
from exporter.sim.engines import start_sim_engines
from exporter.sim.probes import SimProbes, probed_engines
from exporter.sim.scenario import Scenario, Timeline, load_builtin, load_file
from exporter.snapshot import Simulation, Snapshot
from exporter.web.exposition import Exposure

log = logging.getLogger(__name__)


class ManualClock:
    """Scenario time that only moves when told to (stepped simulation)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Exporter:
    runner: Runner
    nvml: Nvml
    timeline: Timeline | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)
    probes: SimProbes | None = None  # the simulated allocator probes, when the scenario has some

    def step(self) -> Snapshot:
        """One stepped cycle: the simulated probe files for this instant, then every collector."""
        if self.probes is not None:
            self.probes.write()
        return self.runner.step().snapshot

    def close(self) -> None:
        # Every thread that may call NVML (collector loops, the XID wait) ends before
        # nvmlShutdown: a call into a shut-down library is undefined behaviour.
        self.runner.stop()
        _release(self.closers, self.nvml, self.timeline)


def _release(closers: list[Callable[[], None]], nvml: Nvml | None, timeline: Timeline | None) -> None:
    for close in reversed(closers):
        with contextlib.suppress(Exception):
            close()
    if nvml is not None:
        nvml.shutdown()
    if timeline is not None:
        fakenvml.uninstall()


def load_scenario(settings: Settings) -> Scenario | None:
    if settings.scenario_file:
        return load_file(settings.scenario_file)
    if settings.simulate:
        return load_builtin(settings.simulate)
    return None


def enrichers(settings: Settings, timeline: Timeline | None = None, epoch: float = 0.0) -> list[Enricher]:
    """Whole-snapshot steps, in order: where a simulation is, the engine-GPU join, then the
    diagnosis."""
    steps: list[Enricher] = []
    if timeline is not None:
        steps.append(simulation_status(timeline, epoch))
    steps += [
        engine_gpus,
        Diagnoser(history_seconds=settings.history_seconds, gpu_hour_price=settings.gpu_hour_price),
    ]
    return steps


def simulation_status(timeline: Timeline, epoch: float) -> Enricher:
    """The scenario, its phase and clock at the snapshot's instant (snapshots carry scenario
    time on the epoch: `taken_at - epoch` is scenario time)."""

    lib = fakenvml.installed()

    def status(snapshot: Snapshot) -> tuple[object, ...]:
        t = max(0.0, snapshot.taken_at - epoch)
        scn = timeline.scenario
        phase = timeline.phase_at(t)
        return (Simulation(scn.name, phase, t, scn.duration, timeline.speed, epoch, lib.cpu_seconds),)

    status.__name__ = "simulation"
    return status


def pod_attribution(socket: str, closers: list[Callable[[], None]]) -> Attribution:
    """GPU uuid -> namespace/pod/container, from the kubelet, refreshed in the background."""
    from exporter.k8s.podresources import PodResourcesWatcher  # needs grpcio: only when asked

    watcher = PodResourcesWatcher(socket)
    closers.append(watcher.stop)

    def labels(uuid: str) -> dict[str, str]:
        ref = watcher.lookup(uuid)
        return {} if ref is None else {"namespace": ref.namespace, "pod": ref.pod, "container": ref.container}

    return labels


def exposure(settings: Settings) -> Exposure:
    """The exposition profile and switches; a family name the catalog does not know fails."""
    named = (*settings.metrics_enabled, *settings.metrics_disabled)
    if named:
        from exporter import catalog  # imports every module: only when names are given

        known = catalog.names()
        unknown = sorted(set(named) - known)
        if unknown:
            raise ConfigError(
                f"unknown metric famil{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)} "
                "in metrics_enabled/metrics_disabled (names as docs/metrics.md lists them)"
            )
    profile: Profile = "full" if settings.metric_profile == "full" else "default"
    return Exposure.of(profile, settings.metrics_enabled, settings.metrics_disabled)


def build(settings: Settings, *, scenario_clock: Callable[[], float] | None = None) -> Exporter:
    """Everything but the HTTP server. Raises NvmlUnavailable without a driver."""
    shown = exposure(settings)  # bad names fail before anything starts
    scenario = load_scenario(settings)
    timeline = None
    clock: Callable[[], float] = time.time
    epoch = 0.0
    sysfs = "/sys"
    if scenario is not None:
        if scenario_clock is None:
            timeline = Timeline(scenario, speed=settings.speed)
        else:
            timeline = Timeline(scenario, speed=1.0, clock=scenario_clock)
        sysfs = fakenvml.install(timeline).sysfs
        epoch = time.time()
        clock = lambda: epoch + timeline.now()  # noqa: E731 - scenario time on the epoch
    closers: list[Callable[[], None]] = []
    nvml = None
    probes = None
    try:
        if timeline is not None and probed_engines(timeline.scenario):
            # The scenario's workers write allocator probe files into a directory of their
            # own, which becomes the probe directory: a host's real probes never mix in.
            probes = SimProbes(timeline)
            closers.append(probes.stop)
            settings = replace(settings, probe_dir=probes.directory)
            if scenario_clock is None:
                probes.start()
        nvml = Nvml()
        if timeline is not None and timeline.scenario.engines:
            # The scenario's engines serve vLLM-format /metrics on loopback; they are scraped
            # like any static target, their simulated pids riding along in the target spec.
            engines = start_sim_engines(timeline)
            closers.extend(e.stop for e in engines)
            settings = replace(settings, engines=(*settings.engines, *(e.target_spec for e in engines)))
        dcgm = start_sim_dcgm_exporter(timeline) if timeline is not None else None
        if dcgm is not None:  # the scenario's dcgm-exporter, read like a co-located one
            closers.append(dcgm.stop)
            settings = replace(settings, dcgm_exporter=dcgm.url)
        runner = Runner(
            collectors.build(
                Context(settings=settings, nvml=nvml, clock=clock, sysfs=sysfs, exposed=shown.allows)
            ),
            interval=settings.interval,
            gpu_count=nvml.count,
            enrichers=enrichers(settings, timeline, epoch),
            clock=clock,
            simulated=timeline is not None,
            attribution=pod_attribution(settings.kubelet_socket, closers)
            if settings.kubelet_socket
            else None,
            exposure=shown,
        )
    except BaseException:
        _release(closers, nvml, timeline)
        raise
    return Exporter(runner=runner, nvml=nvml, timeline=timeline, closers=closers, probes=probes)


def simulate(settings: Settings, step_s: float = 5.0) -> Iterator[Snapshot]:
    """Play a scenario to its end on a manual clock, one snapshot per step.

    The production path runs unchanged (fake NVML under pynvml, every collector, the
    enrichers); only time is stepped instead of waited for.
    """
    clock = ManualClock()
    exporter = build(settings, scenario_clock=clock)
    assert exporter.timeline is not None
    try:
        end = exporter.timeline.scenario.duration
        while clock.t <= end:
            yield exporter.step()
            clock.t += step_s
    finally:
        exporter.close()
