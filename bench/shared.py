"""What each process on a shared GPU costs: sampling CPU and series, measured on the fake GPUs.

    python bench/shared.py [--gpus 8] [--tenants 0 1 3 7] [--runs 300]

For each tenant count T it builds the exporter (as `serve --scenario-file` does: the fake
NVML library under pynvml, the simulated kubelet, API server and cgroups of a time-sliced
node, the `shared` metric profile) on a node of N L40S GPUs, each time-sliced between
one engine and T batch jobs, so each GPU has T + 1 processes. It then times the
processes collector alone (`collect()`: every GPU's compute processes, MPS clients and
utilization samples through NVML, each process' name and its pod through its cgroup
and the pod list) over `--runs` runs, and counts the series a scrape carries per GPU in
the default and in the shared profile. CPU is `time.process_time()`; the fake library's
own CPU (the C work of a real libnvidia-ml, done here in Python) is given apart.
Prints one JSON object; the per-process figure is the slope over the tenant counts.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GPU_SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*\{[^}]*uuid="GPU-')


def scenario(gpus: int, tenants: int) -> str:
    engines = "\n".join(
        f"  - {{name: chat-{g}, gpus: [{g}], gpu_memory_utilization: 0.3}}" for g in range(gpus)
    )
    jobs = "\n".join(
        f"    - {{name: job-{g}-{t}, gpus: [{g}], namespace: batch, labels: {{team: t{t}}}, "
        "sm: 0.05, memory: 0.05}"
        for g in range(gpus)
        for t in range(tenants)
    )
    return f"""
name: shared-bench
gpus: {{count: {gpus}, model: L40S}}
engines:
{engines}
sharing:
  mode: time-slicing
  replicas: 16
  tenants:
{jobs or "    []"}
phases:
  - name: steady
    duration: 86400
    gpu: {{util: 0.9, mem_busy: 0.4, memory_used_ratio: 0.8, power_ratio: 0.6, temp_c: 60}}
    engine: {{request_rate: 2, running: 8, kv_usage: 0.3, gen_tps: 500, ttft_s: 0.08, itl_s: 0.02}}
"""


def series_per_gpu(text: str, gpus: int) -> float:
    return sum(1 for line in text.splitlines() if GPU_SAMPLE.match(line)) / gpus


def measure(gpus: int, tenants: int, runs: int) -> dict[str, Any]:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from exporter.config import Settings
    from exporter.sim import fakenvml, node

    out: dict[str, Any] = {"gpus": gpus, "tenants_per_gpu": tenants, "processes_per_gpu": tenants + 1}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scenario.yaml"
        path.write_text(scenario(gpus, tenants))
        for profile in ("default", "shared"):
            clock = node.ManualClock()
            settings = Settings(
                scenario_file=str(path), metric_profile=profile, collectors_disabled=("allocator",)
            )
            exporter = node.build(settings, clock)
            try:
                for t in (1.0, 2.0):
                    clock.t = t
                    exporter.step()
                assert exporter.runner.published is not None
                out[f"series_per_gpu_{profile}"] = series_per_gpu(
                    exporter.runner.published.text.decode(), gpus
                )
                if profile != "shared":
                    continue
                collector = next(
                    s.collector for s in exporter.runner._slots if s.collector.name == "processes"
                )
                lib = fakenvml.installed()
                lib_before, cpu_before, wall_before = (
                    lib.cpu_seconds,
                    time.process_time(),
                    time.perf_counter(),
                )
                for i in range(runs):
                    clock.t = 3.0 + i  # a new second: new samples past the cursor every run
                    collector.collect()
                cpu = time.process_time() - cpu_before
                lib_cpu = lib.cpu_seconds - lib_before
                out["collect_ms"] = 1000 * cpu / runs
                out["collect_fake_library_ms"] = 1000 * lib_cpu / runs
                out["collect_exporter_ms"] = 1000 * (cpu - lib_cpu) / runs
                out["collect_wall_ms"] = 1000 * (time.perf_counter() - wall_before) / runs
            finally:
                exporter.close()
    return out


def slope(points: list[tuple[float, float]]) -> float:
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--tenants", type=int, nargs="+", default=[0, 1, 3, 7])
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    rows = [measure(args.gpus, t, args.runs) for t in args.tenants]
    procs = [r["processes_per_gpu"] * args.gpus for r in rows]
    result = {
        "rows": rows,
        "per_process": {
            "collect_exporter_us": 1000
            * slope([(p, r["collect_exporter_ms"]) for p, r in zip(procs, rows, strict=True)]),
            "collect_fake_library_us": 1000
            * slope([(p, r["collect_fake_library_ms"]) for p, r in zip(procs, rows, strict=True)]),
            "series_default": slope([(r["processes_per_gpu"], r["series_per_gpu_default"]) for r in rows]),
            "series_shared": slope([(r["processes_per_gpu"], r["series_per_gpu_shared"]) for r in rows]),
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
