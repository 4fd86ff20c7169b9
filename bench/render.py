"""What a scrape pays to render a fresh snapshot: this tree against the exporter at a git
ref, in one run.

    python bench/render.py [--old-ref REF] [--gpus 8,72] [--cycles 40] [--json FILE]

For each GPU count and each tree (the one at `--old-ref`, from `git archive`, and this
one), a fresh process builds the exporter on the benchmark's steady-load H100 scenario
(harness.write_scenario) as `serve` builds it, default metric profile, without starting
its threads, and runs `--cycles` cycles, each as serving runs one: every collector once
and the publish step, a pause of 0.1 s; then the scrape of that new snapshot: both plain
bodies (one pass over the samples), then the gzip of the OpenMetrics body, which is what
Prometheus asks for, each timed as the CPU time of the thread that renders
(`time.thread_time()`: on a machine shared with other jobs, wall time would count their
turns on the cores too). The first 3 cycles are not
counted. The CPU caches are as cold as a scrape finds them after a cycle's work, and an
incremental writer has exactly one cycle's changes to write. The trees alternate
(old, new, old, new) for each GPU count.

Prints a Markdown table (and the raw figures as JSON with --json); a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import ROOT, write_scenario
from idle import unpack

CHILD = """
import json, sys, time
from exporter import app
from exporter.config import load
from exporter.web.exposition import render

scenario, cycles = sys.argv[1], int(sys.argv[2])
exporter = app.build(load({"scenario_file": scenario, "interval": 1.0}, None))
runner = exporter.runner
plain, gz = [], []
for i in range(cycles):
    time.sleep(0.1)
    snapshot = runner.step().snapshot
    rendered = render(snapshot, runner.exposure)
    t0 = time.thread_time()
    rendered.openmetrics
    t1 = time.thread_time()
    rendered.openmetrics_gzip
    t2 = time.thread_time()
    if i >= 3:
        plain.append(t1 - t0)
        gz.append(t2 - t1)
series = sum(1 for line in rendered.text.splitlines() if line and not line.startswith(b"#"))
exporter.close()
print(json.dumps({"render_s": plain, "gzip_s": gz, "series": series, "bytes": len(rendered.openmetrics),
                  "gzip_bytes": len(rendered.openmetrics_gzip)}))
"""


def measure(root: Path, scenario: Path, cycles: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(root))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(scenario), str(cycles)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{root}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def med_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old-ref", default="main", help="the exporter to compare with (default main)")
    p.add_argument("--gpus", default="8,72", help="GPU counts (default 8,72)")
    p.add_argument("--cycles", type=int, default=40, help="cycles per tree and GPU count (default 40)")
    p.add_argument("--repeats", type=int, default=2, help="runs per tree, alternating (default 2)")
    p.add_argument("--json", type=Path, help="also write the raw figures here")
    args = p.parse_args(argv)
    load = [os.getloadavg()[0]]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="llmgpu-render-") as tmp:
        old = Path(tmp) / "old"
        old.mkdir()
        commit = unpack(args.old_ref, old)
        trees = {f"old ({commit})": old, "new (this tree)": ROOT}
        for n in (int(x) for x in args.gpus.split(",")):
            scenario = write_scenario(Path(tmp), n)
            runs: dict[str, dict[str, Any]] = {name: {"render_s": [], "gzip_s": []} for name in trees}
            for _ in range(args.repeats):
                for name, root in trees.items():
                    got = measure(root, scenario, args.cycles)
                    runs[name]["render_s"] += got["render_s"]
                    runs[name]["gzip_s"] += got["gzip_s"]
                    runs[name].update({k: got[k] for k in ("series", "bytes", "gzip_bytes")})
            out[str(n)] = runs
    load.append(os.getloadavg()[0])
    rows = [
        "| GPUs | tree | series | render, both plain bodies: median (p90), CPU | OpenMetrics gzip: median | "
        "scrape's render in all | body / gzip |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, runs in out.items():
        for name, r in runs.items():
            p90 = sorted(r["render_s"])[int(0.9 * len(r["render_s"]))] * 1000
            total = med_ms([a + b for a, b in zip(r["render_s"], r["gzip_s"], strict=True)])
            rows.append(
                f"| {n} | {name} | {r['series']} | {med_ms(r['render_s']):.2f} ms ({p90:.2f}) | "
                f"{med_ms(r['gzip_s']):.2f} ms | {total:.2f} ms | {r['bytes'] // 1024} KiB / "
                f"{r['gzip_bytes'] // 1024} KiB |"
            )
    when = time.strftime("%Y-%m-%d %H:%M")
    print(
        f"{when}: 1-minute load average {load[0]:.2f} before, {load[1]:.2f} after ({os.cpu_count()} cores); "
        f"{args.cycles - 3} cycles x {args.repeats} runs per tree and GPU count"
    )
    print("\n".join(rows))
    if args.json:
        args.json.write_text(json.dumps({"load": load, "results": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
