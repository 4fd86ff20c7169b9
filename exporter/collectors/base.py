"""The collector contract, and the registry that names collectors and their defaults."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exporter.config import Settings
    from exporter.metricdef import MetricDef
    from exporter.nvml import Nvml


@dataclass(frozen=True)
class Output:
    """What one run of a collector found.

    `gpus` maps a GPU index to its readings; `gpu_errors` names the error that kept a
    GPU from being read (that GPU is then reported down); `node` holds readings that
    belong to no single GPU (engines, allocator probes). `errors` counts this run's
    failures by name; a run with none is a success. `call_errors` counts the NVML calls
    among them that failed alone (function, error name): their values are absent and
    the GPU stays up. `by_uuid` holds GPU readings of a
    source that names GPUs by UUID rather than NVML index (a co-located dcgm-exporter);
    the runner puts them on the GPU with that UUID and drops those of GPUs not here.
    """

    gpus: Mapping[int, tuple[object, ...]] = field(default_factory=dict)
    node: tuple[object, ...] = ()
    gpu_errors: Mapping[int, str] = field(default_factory=dict)
    errors: Mapping[str, int] = field(default_factory=dict)
    unsupported: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # gpu -> families
    by_uuid: Mapping[str, tuple[object, ...]] = field(default_factory=dict)
    call_errors: Mapping[tuple[str, str], int] = field(default_factory=dict)


class Collector:
    """One source of readings. The runner owns its lifecycle:

    `start()` once before the first `collect()` (collectors with background work of their
    own, such as the XID event thread or the engine scraper's event loop, begin it here);
    `collect()` every `interval_s` on the thread the NVML collectors share (or on one of
    its own, with `own_thread`, or once a run has hung there), returning what the
    collector knows now; `refresh()` before `collect()` in stepped runs (simulation, CLI),
    doing synchronously what the background work would have done by then; `stop()` once
    at the end, returning only when the collector's threads are done.
    """

    name: str = ""
    interval_s: float = 1.0
    # Where two collectors give a GPU a reading of the same class, the higher precedence
    # wins: whole readings for most classes, field by field for classes that declare
    # `merge_fields` (profiling, which NVML GPM and a dcgm-exporter both provide). Equal
    # precedence: the collector later in name order wins, as it always did.
    precedence: int = 0
    # A collector that waits on the network, up to its timeout, would hold the shared
    # thread's other collectors past their grid points: it gets a thread of its own.
    own_thread: bool = False

    def collect(self) -> Output:
        raise NotImplementedError

    def start(self) -> None:
        """Begin background work; nothing for most collectors."""

    def refresh(self) -> None:
        """Catch up synchronously in stepped runs; nothing for most collectors."""

    def stop(self) -> None:
        """End background work and wait for it; nothing for most collectors."""


@dataclass(frozen=True)
class Context:
    """What a collector factory may use."""

    settings: Settings
    nvml: Nvml | None
    # Wall time, or scenario time mapped onto the epoch when simulating: rates and
    # windows must use this clock so accelerated scenarios stay consistent.
    clock: Callable[[], float] = time.time
    # Wall seconds one second of `clock` takes (1/speed in a played simulation): a
    # collector waiting on its own interval waits `interval * pace` of wall time.
    pace: float = 1.0
    # Root of the sysfs the collectors read (PCI NUMA node, CPU lists); the simulator
    # points it at the tree its GPU profile describes.
    sysfs: str = "/sys"
    # Whether a metric is written at all (the exposure's verdict): a collector may skip
    # reading detail no one sees, as long as what the diagnosis reads stays.
    exposed: Callable[[MetricDef], bool] = lambda metric: True
    # Whether the exporter shares the host's PID namespace (exporter/environment.py):
    # outside it NVML lists only the processes visible there. None: /proc cannot tell.
    host_pid_namespace: bool | None = True
    # The Kubernetes owner of a process id, as label pairs (namespace, pod, container, pod
    # labels); empty when unknown. None: no Kubernetes attribution.
    owner_of: Callable[[int], tuple[tuple[str, str], ...]] | None = None


Factory = Callable[[Context], Collector]


@dataclass(frozen=True)
class Registration:
    name: str
    factory: Factory
    default_enabled: bool
    help: str
    nvml: bool  # needs an NVML session: left out when there is none


REGISTRY: dict[str, Registration] = {}


def register(
    name: str, help: str, *, default: bool = True, nvml: bool = False
) -> Callable[[Factory], Factory]:
    """Decorator: `@register("memory", "...", nvml=True)` on a factory taking a Context.

    `default` says whether the collector runs unless switched off (`--no-collector NAME`);
    `nvml` that it reads the GPUs through NVML and is built only when NVML is there.
    """

    def wrap(factory: Factory) -> Factory:
        if name in REGISTRY and REGISTRY[name].factory is not factory:
            raise ValueError(f"collector {name!r} is registered twice")
        REGISTRY[name] = Registration(name, factory, default, help, nvml)
        return factory

    return wrap
