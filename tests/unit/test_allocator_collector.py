"""The allocator collector reads probe files into llmgpu_allocator_* series."""

from __future__ import annotations

import os
import time
from pathlib import Path

from exporter.allocator_readings import AllocatorProbes
from exporter.collectors.allocator import AllocatorCollector
from exporter.collectors.base import Context
from exporter.config import Settings
from exporter.metricdef import samples
from exporter.probe.schema import ProbeReport


def _collector(directory: Path) -> AllocatorCollector:
    return AllocatorCollector(Context(settings=Settings(probe_dir=str(directory)), nvml=None))


def test_good_and_bad_files(tmp_path: Path) -> None:
    good = ProbeReport(
        timestamp=time.time(),
        pid=os.getpid(),
        state="sampling",
        cuda_available=True,
        interval_seconds=15,
        uuid="GPU-a",
        reserved_bytes=8 << 30,
        allocated_bytes=6 << 30,
        large_free_bytes=2 << 30,
        largest_free_block_bytes=256 << 20,
        fragmentation_ratio=0.875,
        ooms_total=1,
    )
    heartbeat = ProbeReport(
        timestamp=time.time(), pid=os.getpid() + 1, state="no_cuda", cuda_available=False, interval_seconds=15
    )
    (tmp_path / "a.json").write_bytes(good.to_json())
    (tmp_path / "b.json").write_bytes(heartbeat.to_json())
    (tmp_path / "c.json").write_text('{"schema_version": 1, "pid": ')
    out = _collector(tmp_path).collect()
    (reading,) = out.node
    assert isinstance(reading, AllocatorProbes)
    assert [p.pid for p in reading.processes] == [os.getpid()]  # no allocator numbers without CUDA
    assert reading.probes is not None and reading.probes["sampling"] == 1 and reading.probes["no_cuda"] == 1
    assert reading.rejected is not None and reading.rejected["malformed"] == 1
    by_name = {m.name: v for m, labels, v in samples(reading) if dict(labels).get("pid") == str(os.getpid())}
    assert by_name["llmgpu_allocator_fragmentation_ratio"] == 0.875
    assert by_name["llmgpu_allocator_largest_free_block_bytes"] == 256 << 20
    assert by_name["llmgpu_allocator_ooms_total"] == 1


def test_missing_directory_exposes_nothing(tmp_path: Path) -> None:
    assert _collector(tmp_path / "absent").collect().node == ()
