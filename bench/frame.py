"""The live diagnosis frame's cost per cycle, at 8 and 72 GPUs, against another version's.

    python bench/frame.py [--before REF] [--gpus 8 72] [--cycles 30] [--passes 20]

For each GPU count, builds the exporter on a simulated node (H100s, one tensor-parallel-8
vLLM engine per 8 GPUs, each worker with an allocator probe) and runs `--cycles`
one-second cycles as `serve` runs them, each collector on its own interval (so
consecutive snapshots share the readings the slower collectors did not renew). Then
times `frame_of` (CPU time of its thread: what the cycle pays, whatever else the machine
runs) on every snapshot in cycle order, `--passes` times. With `--before`,
REF's `exporter/diagnosis/frame.py` is loaded beside this checkout's (it must import only
what still exists) and the two alternate pass by pass, on the same snapshots, so the
shared machine's load falls on both alike. Prints one Markdown table: the median and
the 10th percentile of the per-cycle times.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from exporter.config import Settings  # noqa: E402
from exporter.diagnosis.frame import frame_of  # noqa: E402
from exporter.sim import node  # noqa: E402
from exporter.snapshot import Snapshot  # noqa: E402

WARM_S = 60  # every collector has run, the slowest (device facts) once


def scenario(gpus: int) -> str:
    engines = "".join(
        f"  - {{name: e{k}, model: meta-llama/Llama-3.1-70B-Instruct, "
        f"gpus: [{', '.join(str(8 * k + i) for i in range(8))}], gpu_memory_utilization: 0.9}}\n"
        for k in range(gpus // 8)
    )
    return (
        f"gpus: {{count: {gpus}, model: H100-80GB-SXM}}\nengines:\n{engines}"
        "phases:\n  - name: steady\n    duration: 36000\n"
        "    gpu: {memory_used_ratio: 0.9, util: 0.75, sm_active: 0.55, tensor_active: 0.4,"
        " dram_active: 0.45,"
        " power_ratio: 0.6, temp_c: 62, sm_clock_ratio: 0.95, nvlink_tx_bps: 6.0e10, nvlink_rx_bps: 6.0e10}\n"
        "    engine: {request_rate: 4, running: 24, kv_usage: 0.35, prompt_tps: 4000, gen_tps: 1200,"
        " ttft_s: 0.09, itl_s: 0.025, api_cpu: 0.25, alloc_reserved_bytes: 1.2e10,"
        " alloc_free_bytes: 1.5e9, alloc_largest_free_bytes: 1.2e9}\n"
    )


def snapshots(gpus: int, cycles: int, tmp: Path) -> list[Snapshot]:
    path = tmp / f"scenario-{gpus}.yaml"
    path.write_text(scenario(gpus))
    clock = node.ManualClock()
    exporter = node.build(Settings(scenario_file=str(path), interval=1.0), clock)
    runner, out = exporter.runner, []
    try:
        for t in range(WARM_S + cycles):
            clock.t = float(t)
            if exporter.environment.before_step is not None:
                exporter.environment.before_step()  # the simulated probe files for this instant
            for slot in runner._slots:
                if t % max(1, round(slot.collector.interval_s)) == 0:
                    slot.collector.refresh()
                    runner.run_collector(slot)
            out.append(runner.publish().snapshot)
    finally:
        exporter.close()
    frame = frame_of(out[-1])
    assert len(frame.gpus) == gpus and len(frame.engines) == gpus // 8, frame
    assert sum(len(g.allocators) for g in frame.gpus) == gpus, "every worker has its probe"
    return out[WARM_S:]


def load_before(ref: str, tmp: Path) -> Callable[[Snapshot], Any]:
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{ref}:exporter/diagnosis/frame.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = tmp / "frame_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("frame_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["frame_before"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    before: Callable[[Snapshot], Any] = module.frame_of
    return before


def one_pass(build: Callable[[Snapshot], Any], snaps: list[Snapshot], into: list[float]) -> None:
    for snap in snaps:
        start = time.thread_time()
        build(snap)
        into.append(time.thread_time() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", help="git ref whose exporter/diagnosis/frame.py to compare with")
    p.add_argument("--gpus", type=int, nargs="+", default=[8, 72])
    p.add_argument("--cycles", type=int, default=30)
    p.add_argument("--passes", type=int, default=20)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        builds: dict[str, Callable[[Snapshot], Any]] = {"this checkout": frame_of}
        if args.before:
            builds = {args.before: load_before(args.before, Path(tmp)), **builds}
        for gpus in args.gpus:
            snaps = snapshots(gpus, args.cycles, Path(tmp))
            times: dict[str, list[float]] = {name: [] for name in builds}
            for _ in range(args.passes):
                for name, build in builds.items():
                    one_pass(build, snaps, times[name])
            for name, ts in times.items():
                cuts = statistics.quantiles(ts, n=10)
                ms = [f"{v * 1e3:.2f} ms" for v in (cuts[0], statistics.median(ts), cuts[-1])]
                rows.append(f"| {gpus} | {name} | {' | '.join(ms)} |")
    print("| GPUs | version | 10th percentile | median | 90th percentile |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
