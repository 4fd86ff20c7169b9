"""Simulated allocator probes: the files the probe inside each engine worker would write.

For every engine a phase gives `alloc_reserved_bytes`, each of its workers (one per GPU,
with the pid the fake NVML lists) gets a probe file in a directory of its own, written
the way the real probe writes it (exporter/probe/plugin.py): one JSON object in the
probe file format (docs/probe.md, schema version 1), replaced atomically through a
hidden temp file. The exporter's allocator collector reads that directory
(`probe_dir`), so the simulation runs the production reader unchanged.

The simulator may not import the exporter's probe package (the layering test), so the
format is written out here; a unit test holds it to the reader. Timestamps are wall
time, as a real probe's are: the reader judges staleness on the wall clock, whatever
speed the scenario plays at. The pid namespace is left out (None): the simulated pids
belong to no namespace, and no liveness check can apply to them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from typing import Any

from exporter.sim.scenario import EngineSpec, Scenario, Timeline

SCHEMA_VERSION = 1  # exporter/probe/schema.py SCHEMA_VERSION
PROBE_KEY = "alloc_reserved_bytes"  # an engine has probes when a phase sets this
INTERVAL_S = 5.0  # the real probe's default interval


def gpu_uuid(scenario: Scenario, index: int) -> str:
    """The UUID the fake NVML gives GPU `index` (exporter/sim/fakenvml/device.py gpu_uuids)."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{scenario.name}/{index}')}"


def probed_engines(scenario: Scenario) -> tuple[EngineSpec, ...]:
    """The engines whose workers write allocator probes."""
    return tuple(
        e
        for e in scenario.engines
        if any(PROBE_KEY in p.engine or PROBE_KEY in p.engines.get(e.name, {}) for p in scenario.phases)
    )


class SimProbes:
    """Writes the probe files of a scenario's engines into its own temporary directory."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.engines = probed_engines(timeline.scenario)
        self.directory = tempfile.mkdtemp(prefix="sim-probes-")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def reports(self, t: float | None = None) -> list[dict[str, Any]]:
        """One probe report per worker of every probed engine, at scenario time t."""
        scn, tl = self.timeline.scenario, self.timeline
        t = tl.now() if t is None else t
        out = []
        for e in self.engines:
            pids = scn.engine_pids(e.name)

            def v(key: str, name: str = e.name) -> float:
                return max(0.0, tl.engine(name, key, t))

            reserved, free = v("alloc_reserved_bytes"), min(v("alloc_free_bytes"), v("alloc_reserved_bytes"))
            largest = min(v("alloc_largest_free_bytes"), free)
            for rank, gpu in enumerate(e.gpus):
                out.append(
                    {
                        "schema_version": SCHEMA_VERSION,
                        "timestamp": time.time(),
                        "pid": pids[gpu],
                        "state": "sampling",
                        "cuda_available": True,
                        "interval_seconds": INTERVAL_S,
                        "process_name": f"VllmWorker-{rank}",
                        "pid_namespace": None,
                        "hostname": None,
                        "rank": rank,
                        "device_index": 0,
                        "uuid": gpu_uuid(scn, gpu),
                        "engine_port": None,
                        "reserved_bytes": int(reserved),
                        "allocated_bytes": int(reserved - free),
                        "alloc_retries_total": int(tl.engine_integral(e.name, "alloc_retry_rate", t)),
                        "ooms_total": int(tl.engine_integral(e.name, "alloc_oom_rate", t)),
                        "large_free_bytes": int(free),
                        "largest_free_block_bytes": int(largest),
                        # 1 - largest / total free, as the probe computes it
                        "fragmentation_ratio": 1.0 - largest / free if free > 0 else 0.0,
                    }
                )
        return out

    def write(self, t: float | None = None) -> int:
        """Write every worker's file for scenario time t (default: now); returns how many."""
        reports = self.reports(t)
        for r in reports:
            name = f"probe-0-{r['pid']}.json"  # no pid namespace: inode 0, as the probe names it
            tmp = os.path.join(self.directory, f".{name}.tmp")
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(r, fh, separators=(",", ":"), allow_nan=False)
            os.replace(tmp, os.path.join(self.directory, name))
        return len(reports)

    def start(self, interval_s: float = INTERVAL_S, pace: float = 1.0) -> None:
        """Keep the files current in real time (a served simulation), every `interval_s` of
        scenario time (`pace` wall seconds each)."""

        def loop() -> None:
            while not self._stop.is_set():
                self.write()
                self._stop.wait(interval_s * pace)

        self.write()
        self._thread = threading.Thread(target=loop, name="sim-probes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        shutil.rmtree(self.directory, ignore_errors=True)
