"""Assembles the exporter from settings and the node's environment: NVML, collectors, runner."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter import collectors, environment
from exporter.collectors.base import Context
from exporter.config import ConfigError, Settings
from exporter.diagnosis.diagnoser import Diagnoser
from exporter.engines.attribution import engine_gpus
from exporter.environment import Environment
from exporter.metricdef import Profile
from exporter.nvml import Nvml
from exporter.runner import Attribution, Enricher, Runner
from exporter.snapshot import Snapshot
from exporter.web.exposition import Exposure

log = logging.getLogger(__name__)


@dataclass
class Exporter:
    runner: Runner
    nvml: Nvml
    environment: Environment
    closers: list[Callable[[], None]] = field(default_factory=list)

    def step(self) -> Snapshot:
        """One stepped cycle: whatever the environment does first (simulated probe files
        for this instant), then every collector."""
        if self.environment.before_step is not None:
            self.environment.before_step()
        return self.runner.step().snapshot

    def close(self) -> None:
        # Every thread that may call NVML (collector loops, the XID wait) ends before
        # nvmlShutdown: a call into a shut-down library is undefined behaviour.
        self.runner.stop()
        _release(self.closers, self.nvml, self.environment)


def _release(closers: list[Callable[[], None]], nvml: Nvml | None, env: Environment) -> None:
    for close in reversed(closers):
        with contextlib.suppress(Exception):
            close()
    if nvml is not None:
        nvml.shutdown()
    env.close()


def enrichers(settings: Settings, env: Environment) -> list[Enricher]:
    """Whole-snapshot steps, in order: the environment's own (where a simulation is), the
    engine-GPU join, then the diagnosis."""
    return [
        *env.enrichers,
        engine_gpus,
        Diagnoser(history_seconds=settings.history_seconds, gpu_hour_price=settings.gpu_hour_price),
    ]


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


def build(settings: Settings, env: Environment | None = None) -> Exporter:
    """Everything but the HTTP server, on the node `env` describes (by default the one the
    settings name: this host, or a scenario's). Raises NvmlUnavailable without a driver."""
    shown = exposure(settings)  # bad names fail before anything starts
    env = env if env is not None else environment.of(settings)
    settings = env.settings
    closers: list[Callable[[], None]] = []
    nvml = None
    try:
        nvml = Nvml()
        runner = Runner(
            collectors.build(
                Context(
                    settings=settings,
                    nvml=nvml,
                    clock=env.clock,
                    pace=env.pace,
                    sysfs=env.sysfs,
                    exposed=shown.allows,
                )
            ),
            interval=settings.interval,
            gpu_count=nvml.count,
            enrichers=enrichers(settings, env),
            clock=env.clock,
            pace=env.pace,
            simulated=env.simulated,
            attribution=pod_attribution(settings.kubelet_socket, closers)
            if settings.kubelet_socket
            else None,
            exposure=shown,
        )
    except BaseException:
        _release(closers, nvml, env)
        raise
    return Exporter(runner=runner, nvml=nvml, environment=env, closers=closers)
