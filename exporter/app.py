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
from exporter.k8s.owners import Owners, PodLabels
from exporter.metricdef import Profile
from exporter.nvml import Nvml
from exporter.runner import Enricher, Runner
from exporter.snapshot import Snapshot
from exporter.web.exposition import Exposure

log = logging.getLogger(__name__)


@dataclass
class Exporter:
    runner: Runner
    nvml: Nvml
    environment: Environment
    closers: list[Callable[[], None]] = field(default_factory=list)
    owners: Owners | None = None

    def step(self) -> Snapshot:
        """One stepped cycle: whatever the environment does first (simulated probe files
        for this instant), the kubelet's and API server's lists, then every collector."""
        if self.environment.before_step is not None:
            self.environment.before_step()
        if self.owners is not None:
            self.owners.refresh()
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


def owners(settings: Settings, env: Environment, closers: list[Callable[[], None]]) -> Owners | None:
    """The owners of GPUs (kubelet pod resources) and of processes (cgroups and this node's
    pods from the API server), each list refreshed in the background; None when neither
    is asked for."""
    if settings.pod_labels and not settings.process_owners:
        raise ConfigError("setting 'pod_labels' needs 'process_owners': the labels come from the pod list")
    if not settings.kubelet_socket and not settings.process_owners:
        return None
    from exporter.k8s.podresources import PodResourcesUnavailableError, PodResourcesWatcher

    devices = pods = None
    if settings.kubelet_socket:
        # every cycle (every second at most): a pod that ends leaves its GPU's labels at the next one
        try:
            devices = PodResourcesWatcher(settings.kubelet_socket, refresh_s=max(settings.interval, 1.0))
        except PodResourcesUnavailableError as err:  # grpcio or protobuf missing
            raise ConfigError(f"setting 'kubelet_socket': {err}") from None
        closers.append(devices.stop)
    if settings.process_owners:
        from exporter.k8s.pods import ApiServer, KubernetesConfigError, NodePodsWatcher

        if not settings.node_name:
            raise ConfigError("setting 'process_owners' needs 'node_name' (NODE_NAME)")
        try:
            api = ApiServer(env.kubernetes_api) if env.kubernetes_api else ApiServer.in_cluster()
        except KubernetesConfigError as err:
            raise ConfigError(f"setting 'process_owners': {err}") from None
        pods = NodePodsWatcher(settings.node_name, api, proc_root=env.proc_root)
        closers.append(pods.stop)
    labels = PodLabels(settings.pod_labels, settings.pod_labels_max)
    return Owners(pods=pods, devices=devices, labels=labels, proc_root=env.proc_root)


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
    profile: Profile = settings.metric_profile
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
        who = owners(settings, env, closers)
        nvml = Nvml()
        ctx = Context(
            settings=settings,
            nvml=nvml,
            clock=env.clock,
            pace=env.pace,
            sysfs=env.sysfs,
            exposed=shown.allows,
            host_pid_namespace=env.host_pid_namespace,
            owner_of=who.process if who is not None and settings.process_owners else None,
        )
        runner = Runner(
            collectors.build(ctx),
            interval=settings.interval,
            gpu_count=nvml.count,
            enrichers=enrichers(settings, env),
            clock=env.clock,
            pace=env.pace,
            simulated=env.simulated,
            attribution=who.gpu if who is not None and settings.kubelet_socket else None,
            exposure=shown,
        )
    except BaseException:
        _release(closers, nvml, env)
        raise
    return Exporter(runner=runner, nvml=nvml, environment=env, closers=closers, owners=who)
