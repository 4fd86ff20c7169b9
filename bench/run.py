"""Benchmark of llm-gpu-exporter on simulated GPUs, with nvitop-exporter as the reference.

    python bench/run.py [--out docs/benchmarks.md] [--quick] [--gpus 1,8,72] [--json RAW.json]
    python bench/run.py --from-json RAW.json [--out docs/benchmarks.md]

The measurements are in bench/harness.py, the Markdown report in bench/report.py (with
report_method.py and report_text.py); this is the command line. `--from-json` renders the
report again from raw results that `--json` saved, without measuring.

For each GPU count it writes a steady-load scenario (H100 SXM, no inference engine, so
GPU sampling is what is measured) and then, in this order:

1. sampling CPU, in a fresh subprocess (bench/sampling.py): every collector's CPU per
   run, the publish step (compose, enrichers, and the render of both formats with their
   gzip bodies) and the fake library's own share; nvitop-exporter's update loop is timed
   the same way (bench/nvitop_on_fake.py);
2. the memory the diagnosis history takes once it holds its whole span (bench/sampling.py
   --history), to project our RSS at steady state;
3. both exporters served as real subprocesses on loopback against the same fake GPUs:
   process CPU over the same idle wall window (no scrapes), the series each exposes,
   then /metrics latency with one keep-alive client and with 10 concurrent scrapers, for
   a plain request, a gzip request and the request Prometheus sends (OpenMetrics first,
   gzip), and one Prometheus request per publish cycle, in rounds that alternate between
   the exporters; the one not being measured is paused (SIGSTOP), so the two never
   compete for the cores;
4. peak RSS (VmHWM) of each server.

This is a benchmark, not a test: nothing fails when a target is missed; the report says
so. Every loop is bounded in count and in time, everything listens on 127.0.0.1 only,
and every process started here is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata as md
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from harness import ROOT, Contention, bench_count, log
from report import report
from settings import FULL, QUICK

DEFAULT_GPUS = "1,8,72"


def version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def source_state() -> str:
    """The commit measured, and whether the package had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "exporter"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"commit {head}" + (" with uncommitted changes under exporter/" if dirty else "")


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = psutil.virtual_memory().total
    return {
        "cpu": model or platform.processor(),
        "cores": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "memory_gib": mem / 1024**3,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def nvitop_available(install: bool) -> tuple[bool, str]:
    if importlib.util.find_spec("nvitop_exporter") is not None:
        return True, "used"
    if not install:
        return False, "it is not installed and --no-install was given (`pip install nvitop-exporter`)."
    log("nvitop-exporter is not installed; installing it with pip")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "nvitop-exporter"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    importlib.invalidate_caches()
    if done.returncode == 0 and importlib.util.find_spec("nvitop_exporter") is not None:
        return True, "used"
    return False, f"`pip install nvitop-exporter` failed: {done.stderr.strip()[-300:]}"


@contextlib.contextmanager
def workdir(keep: bool) -> Iterator[Path]:
    if keep:
        path = Path(tempfile.mkdtemp(prefix="llmgpu-bench-"))
        log(f"keeping scenarios and server logs in {path}")
        yield path
    else:
        with tempfile.TemporaryDirectory(prefix="llmgpu-bench-") as d:
            yield Path(d)


def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every GPU count's results, and the run's details for the report."""
    plan = QUICK if args.quick else FULL
    counts = [int(x) for x in args.gpus.split(",") if x.strip()]
    started = time.monotonic()
    ok, reason = nvitop_available(not args.no_install)
    if not ok:
        log(f"running without the reference: {reason}")
    load_before = os.getloadavg()[0]
    contention = Contention()
    source = source_state()
    results = []
    with workdir(args.keep) as wd:
        for n in counts:
            results.append(bench_count(n, plan, wd, ok))
    shown = ["python", "bench/run.py"]
    if args.out:
        shown += ["--out", str(args.out)]
    if args.quick:
        shown.append("--quick")
    if args.gpus != DEFAULT_GPUS:
        shown += ["--gpus", args.gpus]
    meta = {
        "command": " ".join(shown),
        "quick": args.quick,
        "source": source,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "duration_s": time.monotonic() - started,
        "machine": machine(),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "contention": contention.result(),
        "nvitop": "used" if ok else "absent",
        "nvitop_reason": reason,
        "versions": {
            d: version(d)
            for d in ("nvidia-ml-py", "prometheus-client", "fastapi", "uvicorn", "httpx", "nvitop-exporter")
        },
    }
    return results, meta


def render_saved(path: Path) -> str:
    """The report of raw results that `--json` saved; ValueError says what is wrong with them."""
    try:
        raw = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON: {e}") from e
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("meta"), dict)
        or not isinstance(raw.get("results"), list)
    ):
        raise ValueError(f"{path} does not hold raw results: expected an object with 'meta' and 'results'")
    try:
        return report(raw["results"], raw["meta"])
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        what = f"lacks {e.args[0]!r}" if isinstance(e, KeyError) else f"has a value of the wrong kind ({e})"
        raise ValueError(f"{path} {what}: not raw results as this bench/run.py saves them with --json") from e


HANDWRITTEN = re.compile(r"^## .*\(hand-written\)$", re.MULTILINE)


def handwritten(path: Path) -> str:
    """The hand-written sections at the end of an existing report (from the first heading
    that says so), kept when the generated part above them is written again."""
    if not path.exists():
        return ""
    old = path.read_text()
    found = HANDWRITTEN.search(old)
    return "\n" + old[found.start() :] if found else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write the Markdown report here (default: stdout)")
    p.add_argument("--json", type=Path, help="also write the raw results as JSON")
    p.add_argument(
        "--from-json",
        type=Path,
        metavar="FILE",
        help="render the report from raw results saved with --json, without measuring",
    )
    p.add_argument("--quick", action="store_true", help="short loops, for trying the script out")
    p.add_argument("--gpus", default=DEFAULT_GPUS, help="GPU counts (default 1,8,72)")
    p.add_argument("--no-install", action="store_true", help="do not pip-install a missing nvitop-exporter")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (scenarios, logs)")
    args = p.parse_args(argv)
    if args.from_json:
        given = {
            "--json": args.json is not None,
            "--quick": args.quick,
            "--gpus": args.gpus != DEFAULT_GPUS,
            "--no-install": args.no_install,
            "--keep": args.keep,
        }
        if any(given.values()):
            extra = ", ".join(k for k, v in given.items() if v)
            p.error(f"--from-json measures nothing; {extra} apply to a measuring run")
        try:
            text = render_saved(args.from_json)
        except ValueError as e:
            p.error(str(e))
        done = f"from {args.from_json}"
    else:
        results, meta = measure(args)
        if args.json:  # first: should the report fail, the measurements are still kept
            args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
        text = report(results, meta)
        done = f"in {meta['duration_s']:.0f} s"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + handwritten(args.out))
        log(f"wrote {args.out} {done}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
