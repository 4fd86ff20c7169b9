"""A simulated node: the environment a scenario hands the exporter.

`environment(settings)` installs the fake NVML library under pynvml, writes the sysfs
of its GPUs, starts the scenario's engines (vLLM-format /metrics on loopback), its
dcgm-exporter and its allocator probes, and returns the settings with their targets
added, scenario time as the clock, and what to stop when the exporter closes.
`app.build` then assembles the production exporter unchanged.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator

from exporter import app
from exporter.config import Settings, replace
from exporter.environment import Environment
from exporter.sim import fakenvml
from exporter.sim.dcgm import start_sim_dcgm_exporter
from exporter.sim.engines import start_sim_engines
from exporter.sim.probes import SimProbes, probed_engines
from exporter.sim.scenario import Scenario, Timeline, load_builtin, load_file
from exporter.snapshot import Simulation, Snapshot


class ManualClock:
    """Scenario time that only moves when told to (stepped simulation)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def scenario_of(settings: Settings) -> Scenario:
    if settings.scenario_file:
        return load_file(settings.scenario_file)
    assert settings.simulate, "not a simulated node"
    return load_builtin(settings.simulate)


def environment(settings: Settings, scenario_clock: Callable[[], float] | None = None) -> Environment:
    """The scenario's node; with `scenario_clock`, stepped by hand instead of played in real time."""
    scenario = scenario_of(settings)
    if scenario_clock is None:
        timeline = Timeline(scenario, speed=settings.speed)
    else:
        timeline = Timeline(scenario, speed=1.0, clock=scenario_clock)
    lib = fakenvml.install(timeline)
    epoch = time.time()
    env = Environment(
        settings,
        sysfs=lib.sysfs,
        clock=lambda: epoch + timeline.now(),  # scenario time on the epoch
        pace=1.0 / timeline.speed if scenario_clock is None else 1.0,
        enrichers=(simulation_status(timeline, epoch),),
        simulated=True,
        host_pid_namespace=scenario.profile.host_pid,
        closers=[fakenvml.uninstall],
    )
    try:
        added: dict[str, object] = {}
        if probed_engines(scenario):
            # The scenario's workers write allocator probe files into a directory of their
            # own, which becomes the probe directory: a host's real probes never mix in.
            probes = SimProbes(timeline)
            env.closers.append(probes.stop)
            added["probe_dir"] = probes.directory
            if scenario_clock is None:
                probes.start(pace=1.0 / timeline.speed)
            else:
                env.before_step = probes.write
        if scenario.engines:
            # Scraped like any static target, their simulated pids riding along in the spec.
            engines = start_sim_engines(timeline)
            env.closers.extend(e.stop for e in engines)
            added["engines"] = (*settings.engines, *(e.target_spec for e in engines))
        if scenario.sharing is not None:
            # Shared GPUs: a kubelet, an API server and cgroups of the simulated pods, read
            # by the exporter's own Kubernetes join.
            from exporter.sim.kubernetes import NODE, SimKubernetes

            k8s = SimKubernetes(timeline, lib.uuids)
            env.closers.append(k8s.stop)
            added.update(kubelet_socket=k8s.socket, process_owners=True, node_name=NODE)
            env = dataclasses.replace(env, proc_root=k8s.proc_root, kubernetes_api=k8s.api_url)
        dcgm = start_sim_dcgm_exporter(timeline)
        if dcgm is not None:  # the scenario's dcgm-exporter, read like a co-located one
            env.closers.append(dcgm.stop)
            added["dcgm_exporter"] = dcgm.url
    except BaseException:
        env.close()
        raise
    return dataclasses.replace(env, settings=replace(settings, **added)) if added else env


def simulation_status(timeline: Timeline, epoch: float) -> Callable[[Snapshot], tuple[object, ...]]:
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


def build(settings: Settings, clock: ManualClock) -> app.Exporter:
    """An exporter over the scenario, stepped by hand on `clock`."""
    return app.build(settings, environment(settings, clock))


def play(settings: Settings, step_s: float = 5.0) -> Iterator[Snapshot]:
    """Play a scenario to its end on a manual clock, one snapshot per step.

    The production path runs unchanged (fake NVML under pynvml, every collector, the
    enrichers); only time is stepped instead of waited for.
    """
    clock = ManualClock()
    exporter = build(settings, clock)
    end = scenario_of(settings).duration
    try:
        while clock.t <= end:
            yield exporter.step()
            clock.t += step_s
    finally:
        exporter.close()
