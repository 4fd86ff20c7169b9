"""CPU of one sampling cycle, measured in this process on the simulator's fake GPUs.

    python bench/sampling.py SCENARIO_FILE [--budget SECONDS] [--max-passes K]
    python bench/sampling.py SCENARIO_FILE --history [--budget SECONDS]

Builds the exporter exactly as `serve --scenario-file` does (fake NVML library under
pynvml, every default collector, the enrichers), without starting its threads. After a
warm-up it runs K passes; in each one every collector runs once (as `Runner.step()`
does, less its synchronous engine refresh), then the runner publishes (compose and the
enrichers; exposition bytes are made only when a scrape reads them), then the new
snapshot is scraped: both formats rendered in one pass, then both gzipped, as a scraper
of every cycle would have them made (the writer has one cycle's changes to write). CPU
is `time.process_time()` around each piece; garbage collections during the passes are
timed through `gc.callbacks`. Some collectors do part of their work only
every few runs (NVLink state and error counters every `SLOW_EVERY` runs), so K is a
multiple of that period and every figure is an average over whole periods.
Prints one JSON object on stdout; run.py turns it into the tables.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import resource
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MICRO_CALLS = 2000


def _repo_on_path() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def measure(scenario_file: str, budget_s: float, max_passes: int, warmup: int = 3) -> dict[str, Any]:
    _repo_on_path()
    import pynvml
    from fakecalls import Recorder, replay_seconds

    from exporter import app
    from exporter.collectors.base import REGISTRY
    from exporter.collectors.nvlink import SLOW_EVERY
    from exporter.config import load
    from exporter.web.exposition import GZIP_LEVEL

    settings = load({"scenario_file": scenario_file, "interval": 1.0}, None)
    exporter = app.build(settings)
    runner = exporter.runner
    lib = pynvml.nvmlLib
    slots = list(runner._slots)  # the runner's own list: the same order step() uses
    nvml_names = {name for name, reg in REGISTRY.items() if reg.nvml}
    period = max(1, SLOW_EVERY)  # runs after which every collector has done all its work once
    max_passes = max(period, max_passes - max_passes % period)

    def run(slot: Any) -> None:
        # What the collector threads of a serving exporter do. (`step()` also calls the
        # engines collector's refresh(), a synchronous scrape round that `serve` leaves to
        # the scraper's own thread; it is not part of a serving cycle.)
        runner.run_collector(slot)

    for _ in range(warmup):
        runner.step()

    cpu: dict[str, float] = defaultdict(float)
    publish_s = render_s = gzip_s = 0.0
    passes = 0
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    started = time.process_time()
    wall_started = time.monotonic()
    rendered = runner.published
    while passes < max_passes and (
        passes < period or passes % period or time.monotonic() - wall_started < budget_s
    ):
        for slot in slots:
            t0 = time.process_time()
            run(slot)
            cpu[slot.collector.name] += time.process_time() - t0
        t0 = time.process_time()
        rendered = runner.publish()  # compose, enrichers (bytes are made when read)
        t1 = time.process_time()
        rendered.text  # noqa: B018 - a scrape of the new snapshot: both formats, one pass
        t2 = time.process_time()
        rendered.text_gzip  # noqa: B018
        rendered.openmetrics_gzip  # noqa: B018
        publish_s += t1 - t0
        render_s += t2 - t1
        gzip_s += time.process_time() - t2
        passes += 1
    total_cpu = time.process_time() - started
    gc.callbacks.remove(pauses)

    assert rendered is not None

    # The fake's share: record a whole period of runs of every collector, replay it on
    # the fake alone; calls and CPU are per run (the period's total over its runs).
    replay_passes = max(3, passes // period)
    fake: dict[str, dict[str, float]] = {}
    for slot in slots:
        with Recorder(lib) as rec:
            for _ in range(period):
                run(slot)
        fake[slot.collector.name] = {
            "calls": len(rec.calls) / period,
            "cpu_s": replay_seconds(rec.calls, replay_passes) / period,
        }

    micro = micro_calls(pynvml, lib)
    text = rendered.text
    result = {
        "gpus": runner.gpu_count,
        "passes": passes,
        "period_runs": period,
        "measured_cpu_s": total_cpu,
        "threads_alive": threading.active_count(),
        "collectors": {
            slot.collector.name: {
                "nvml": slot.collector.name in nvml_names,
                "interval_s": slot.collector.interval_s,
                "cpu_s": cpu[slot.collector.name] / passes,
                "fake_calls": fake[slot.collector.name]["calls"],
                "fake_cpu_s": fake[slot.collector.name]["cpu_s"],
            }
            for slot in slots
        },
        "cycle_interval_s": settings.interval,
        "publish_s": publish_s / passes,
        "render_s": render_s / passes,
        "gzip_s": gzip_s / passes,
        "gzip_level": GZIP_LEVEL,
        # Collections during the measured passes (their time is inside the figures above).
        "gc": pauses.summary(passes),
        "text_bytes": len(text),
        "text_gzip_bytes": len(rendered.text_gzip),
        "openmetrics_bytes": len(rendered.openmetrics),
        "openmetrics_gzip_bytes": len(rendered.openmetrics_gzip),
        "series": sum(1 for line in text.splitlines() if line and not line.startswith(b"#")),
        "micro": micro,
        "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }
    exporter.close()
    return result


class GcPauses:
    """gc.callbacks hook: wall time of every collection, by generation. A collection holds
    the GIL from start to end, so its length is also how long every other thread waits."""

    def __init__(self) -> None:
        self.started = 0.0
        self.pauses: list[tuple[int, float]] = []

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self.started))

    def summary(self, passes: int) -> dict[str, Any]:
        full = [s for g, s in self.pauses if g == 2]
        return {
            "per_pass_s": sum(s for _, s in self.pauses) / max(1, passes),
            "max_s": max((s for _, s in self.pauses), default=0.0),
            "full_collections": len(full),
            "full_max_s": max(full, default=0.0),
        }


def history_growth(scenario_file: str, budget_s: float) -> dict[str, Any]:
    """Memory the diagnosis history takes once it holds its whole span.

    A serving exporter keeps `history_seconds` (900 by default) of frames: every frame
    of the last DENSE_S seconds, one every SPARSE_STEP_S seconds before. A benchmark run
    serves each GPU count for a minute or so, so here the history is filled to that
    steady state directly, with scenario time stepped by hand: first one frame every
    SPARSE_STEP_S seconds for the older part of the span, then one a second for the
    dense part. For each frame the per-second collectors run (values move with scenario
    time, as they would), the snapshot is composed and the enrichers (the diagnosis with
    its history) run; rendering is left out, as it keeps nothing between cycles.
    """
    _repo_on_path()
    import uvicorn  # noqa: F401 - what `serve` has loaded before it samples anything

    from exporter.config import load
    from exporter.diagnosis.diagnoser import Diagnoser
    from exporter.diagnosis.history import DENSE_S, SPARSE_STEP_S
    from exporter.sim import node
    from exporter.web import server  # noqa: F401

    imports = _rss_kib()
    settings = load({"scenario_file": scenario_file, "interval": 1.0}, None)
    clock = node.ManualClock()
    exporter = node.build(settings, clock)
    runner = exporter.runner
    diagnosers = [e for e in runner.enrichers if isinstance(e, Diagnoser)]
    fast = [slot for slot in runner._slots if slot.collector.interval_s <= settings.interval]
    for _ in range(3):
        runner.step()
        clock.t += 1.0
    span = float(settings.history_seconds)
    dense = min(span, DENSE_S)
    sparse_frames = math.ceil((span - dense) / SPARSE_STEP_S)
    steps = [SPARSE_STEP_S] * sparse_frames + [1.0] * int(dense)
    before = _rss_kib()
    held_before = len(diagnosers[0].history) if diagnosers else 0
    started = time.monotonic()
    done = 0
    for step in steps:
        if time.monotonic() - started >= budget_s:
            break
        for slot in fast:
            runner.run_collector(slot)
        snapshot = runner.compose()
        for enrich in runner.enrichers:
            snapshot = snapshot.with_node(enrich(snapshot))
        clock.t += step
        done += 1
    wall = time.monotonic() - started
    after = _rss_kib()
    held = len(diagnosers[0].history) if diagnosers else 0
    exporter.close()
    added = max(1, held - held_before)
    return {
        "history_seconds": span,
        "dense_s": DENSE_S,
        "sparse_step_s": SPARSE_STEP_S,
        "steady_frames": sparse_frames + int(dense),
        "frames_stepped": done,
        "frames_planned": len(steps),
        "frames_held": held,
        "full": done == len(steps),
        "wall_s": wall,
        "rss_imports_kib": imports,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "kib_per_frame": (after - before) / added,
    }


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def micro_calls(pynvml: Any, lib: Any) -> dict[str, float]:
    """One NVML call, through pynvml vs the fake's function alone (seconds per call)."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    t0 = time.process_time()
    for _ in range(MICRO_CALLS):
        pynvml.nvmlDeviceGetPowerUsage(handle)
    through_pynvml = (time.process_time() - t0) / MICRO_CALLS
    import ctypes

    out = ctypes.c_uint()
    ref = ctypes.byref(out)
    fn = lib.nvmlDeviceGetPowerUsage
    t0 = time.process_time()
    for _ in range(MICRO_CALLS):
        fn(handle, ref)
    fake_only = (time.process_time() - t0) / MICRO_CALLS
    return {"pynvml_call_s": through_pynvml, "fake_call_s": fake_only}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario_file")
    p.add_argument("--budget", type=float, default=10.0, help="wall seconds of measured passes (>= 3 passes)")
    p.add_argument("--max-passes", type=int, default=200)
    p.add_argument(
        "--history",
        action="store_true",
        help="instead: fill the diagnosis history to its steady state (within --budget)",
    )
    args = p.parse_args()
    if args.history:
        print(json.dumps(history_growth(args.scenario_file, args.budget)))
    else:
        print(json.dumps(measure(args.scenario_file, args.budget, args.max_passes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
