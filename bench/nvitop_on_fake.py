"""Run nvitop-exporter against the simulator's fake NVML library, in this process.

    python bench/nvitop_on_fake.py SCENARIO_FILE -- [nvitop-exporter arguments]
    python bench/nvitop_on_fake.py SCENARIO_FILE --time-cycles K

The fake library (exporter.sim.fakenvml) is put where libnvidia-ml would be, under
pynvml, exactly as `llm-gpu-exporter --scenario-file` does; then nvitop-exporter's own
console-script entry point runs unchanged. NVML symbols that nvitop asks for and the
fake does not implement raise NVMLError_FunctionNotFound inside pynvml (nvitop then
reports N/A); each such symbol is announced once on stderr as

    nvitop-on-fake: missing NVML symbol nvmlDeviceGetFanSpeed

With --time-cycles, nothing is served: nvitop-exporter's update loop body (host, then
every device) runs K times after a warm-up and the CPU it took is printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MISSING_PREFIX = "nvitop-on-fake: missing NVML symbol "


def _repo_on_path() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def install_fake(scenario_file: str) -> Any:
    """Load the scenario and install a fake library that reports missing symbols."""
    _repo_on_path()
    import pynvml

    from exporter.sim import fakenvml
    from exporter.sim.scenario import Timeline, load_file

    class AnnouncingFake(fakenvml.FakeLibrary):
        announced: set[str] = set()

        def __getattr__(self, name: str) -> Any:
            # Only reached for attributes the fake lacks: pynvml turns the
            # AttributeError into NVMLError_FunctionNotFound.
            if name.startswith("nvml") and name not in self.announced:
                self.announced.add(name)
                print(MISSING_PREFIX + name, file=sys.stderr, flush=True)
            raise AttributeError(name)

    lib = AnnouncingFake(Timeline(load_file(scenario_file)))
    with pynvml.libLoadLock:  # the same three steps as fakenvml.install()
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
    return lib


def entry_point() -> Any:
    """nvitop-exporter's console script, resolved from its installed metadata."""
    for ep in metadata.entry_points(group="console_scripts"):
        if ep.name == "nvitop-exporter":
            return ep.load()
    raise SystemExit("nvitop-exporter is not installed (pip install nvitop-exporter)")


def time_cycles(lib: Any, cycles: int, warmup: int = 3) -> dict[str, Any]:
    """CPU per pass of nvitop-exporter's update loop body, without serving."""
    from fakecalls import Recorder, replay_seconds
    from nvitop import Device
    from nvitop_exporter.exporter import PrometheusExporter
    from prometheus_client import CollectorRegistry

    devices = Device.from_indices(range(Device.count()))
    exp = PrometheusExporter(devices, hostname="bench", registry=CollectorRegistry(), interval=1.0)

    def update_devices() -> None:
        for d in devices:
            exp.update_device(d)

    for _ in range(warmup):
        exp.update_host()
        update_devices()
    host = device = 0.0
    calls_before = lib.calls
    for _ in range(cycles):
        t0 = time.process_time()
        exp.update_host()
        t1 = time.process_time()
        update_devices()
        t2 = time.process_time()
        host += t1 - t0
        device += t2 - t1
    calls = lib.calls - calls_before
    with Recorder(lib) as rec:
        update_devices()
    return {
        "gpus": len(devices),
        "cycles": cycles,
        "host_s": host / cycles,
        "devices_s": device / cycles,
        "fake_calls": calls / cycles,
        "fake_cpu_s": replay_seconds(rec.calls, max(3, cycles)),
        "missing_symbols": sorted(lib.announced),
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1 :]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario_file")
    p.add_argument("--time-cycles", type=int, metavar="K", help="time K update passes and exit")
    args = p.parse_args(argv)
    lib = install_fake(args.scenario_file)
    if args.time_cycles:
        print(json.dumps(time_cycles(lib, args.time_cycles)))
        return 0
    main_fn = entry_point()
    sys.argv = ["nvitop-exporter", *rest]
    return int(main_fn() or 0)


if __name__ == "__main__":
    sys.exit(main())
