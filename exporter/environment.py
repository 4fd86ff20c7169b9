"""What a node hands the exporter besides its settings.

On a GPU node that is the host itself: /sys, the wall clock, nothing to start or stop.
The simulator hands a node of its own making instead (exporter/sim/node.py): a fake
NVML library already installed, a sysfs of the fake GPUs, scenario time, its engines'
and dcgm-exporter's targets in the settings, and what to stop when the exporter closes.
`app.build` assembles the same exporter from either.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.config import Settings
from exporter.snapshot import Snapshot

Enricher = Callable[[Snapshot], tuple[object, ...]]


@dataclass
class Environment:
    settings: Settings  # the settings the exporter runs with (the simulator adds its targets)
    sysfs: str = "/sys"
    clock: Callable[[], float] = time.time  # what `taken_at` is measured on
    enrichers: tuple[Enricher, ...] = ()  # whole-snapshot steps before the engine-GPU join
    before_step: Callable[[], object] | None = None  # in stepped runs, before each cycle
    simulated: bool = False
    proc_root: str = "/proc"  # where processes' cgroups are read (the simulator's own tree)
    kubernetes_api: str | None = None  # the API server's URL; None: the in-cluster one
    # Released after NVML is shut down, last started first.
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        while self.closers:
            try:
                self.closers.pop()()
            except Exception:  # one failing release never keeps the others from running
                continue


def of(settings: Settings, scenario_clock: Callable[[], float] | None = None) -> Environment:
    """The host's environment, or for a scenario the simulator's (the one place it plugs in).

    `scenario_clock` steps a simulation by hand instead of playing it in real time.
    """
    if settings.simulated:
        from exporter.sim.node import environment

        return environment(settings, scenario_clock)
    return Environment(settings)
