"""What a node hands the exporter besides its settings.

On a GPU node that is the host itself: /sys, the wall clock, nothing to start or stop.
The simulator hands a node of its own making instead (exporter/sim/node.py): a fake
NVML library already installed, a sysfs of the fake GPUs, scenario time, its engines'
and dcgm-exporter's targets in the settings, and what to stop when the exporter closes.
`app.build` assembles the same exporter from either.

The node also says whether the exporter shares the host's PID namespace. The kernel
driver translates the pid of every GPU process into the caller's namespace and leaves
out those it cannot see there (open-gpu-kernel-modules: `gpuGetProcWithObject` skips a
client whose `_gpuConvertPid` answers NV_ERR_OBJECT_NOT_FOUND), so outside the host's
namespace NVML's process list is empty or partial. The test is the inode of
`/proc/self/ns/pid`: the initial PID namespace always has PROC_PID_INIT_INO (0xEFFFFFFC,
include/linux/proc_ns.h, fixed since Linux 3.8) and any other one a number allocated
from 0xF0000000 up. Comparing with `/proc/1/ns/pid` proves nothing (in a container pid 1
is the container's own init), and neither does the length of `NSpid` in
`/proc/self/status`: it starts at the namespace of whoever mounted that /proc, which in
a container is the container's own.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.config import Settings
from exporter.snapshot import Snapshot

Enricher = Callable[[Snapshot], tuple[object, ...]]
PROC_PID_INIT_INO = 0xEFFFFFFC  # include/linux/proc_ns.h: the initial PID namespace's inode


def host_pid_namespace(proc: str = "/proc") -> bool | None:
    """True in the host's (initial) PID namespace, False in another, None where /proc cannot tell."""
    try:
        link = os.readlink(os.path.join(proc, "self/ns/pid"))
    except OSError:
        return None
    m = re.fullmatch(r"pid:\[(\d+)\]", link)
    return None if m is None else int(m.group(1)) == PROC_PID_INIT_INO


@dataclass
class Environment:
    settings: Settings  # the settings the exporter runs with (the simulator adds its targets)
    sysfs: str = "/sys"
    clock: Callable[[], float] = time.time  # what `taken_at` is measured on
    # Wall seconds one second of `clock` takes: 1/speed while a scenario plays. Intervals
    # are seconds of `clock`, so a scenario played fast is sampled as often, in its own
    # time, as a node in real time: every figure and window means the same at any speed.
    pace: float = 1.0
    enrichers: tuple[Enricher, ...] = ()  # whole-snapshot steps before the engine-GPU join
    before_step: Callable[[], object] | None = None  # in stepped runs, before each cycle
    simulated: bool = False
    # Whether NVML's process lists are whole here (see the module docstring); None: unknown.
    host_pid_namespace: bool | None = field(default_factory=host_pid_namespace)
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
