"""A call's error takes away that call's values; only the GPU failing takes the GPU down."""

from __future__ import annotations

import ctypes

from exporter.gpu_readings import Memory, NvLink
from exporter.nvml import FI_NVLINK_CRC_DATA_ERROR_COUNT
from exporter.sim.gpu_models import MODELS

H100 = """
name: t
gpus: {count: 2, model: H100-80GB-SXM}
phases:
  - {name: p, duration: 1000, gpu: {util: 0.5, nvlink_tx_bps: 1.0e+9, nvlink_error_rate: 2}}
"""
CALL = 'collector="nvlink",error="InvalidArgument",function="nvmlDeviceGetNvLinkErrorCounter"'


def test_a_counter_a_link_lacks_never_takes_the_gpus_down(sim) -> None:  # type: ignore[no-untyped-def]
    """The data CRC counter past link 11 answers InvalidArgument (nvml.h: "link, or counter
    is invalid") on every slow run: the GPUs stay up through several of them."""
    s = sim(H100, metric_profile="full")
    links = MODELS["H100-80GB-SXM"].nvlinks
    kept = len(FI_NVLINK_CRC_DATA_ERROR_COUNT)
    assert links > kept  # the part has links without a data CRC counter
    for t in range(1, 24):  # the error counters are read on runs 0, 10 and 20
        snap = s.at(t)
        assert all(g.up for g in snap.gpus), f"a GPU went down at t={t}"
    for g in snap.gpus:
        ports = g.get(NvLink).links
        assert len(ports) == links
        assert all("crc_data" in p.errors for p in ports[:kept])
        assert all("crc_data" not in p.errors and "crc_flit" in p.errors for p in ports[kept:])
        assert g.get(NvLink).links_up == links
    text = s.text()
    # Counted per call: 6 links x 2 GPUs x 3 slow runs, by function and error name.
    want = (links - kept) * 2 * 3
    assert f"llmgpu_exporter_nvml_call_errors_total{{{CALL}}} {want:.1f}" in text
    # An answer about one call, not a failure of the collector.
    assert {c.collector: c for c in snap.collectors}["nvlink"].success == 1
    assert 'collector_errors_total{collector="nvlink"' not in text
    assert all(line.endswith(" 1.0") for line in text.splitlines() if line.startswith("llmgpu_gpu_up{"))


def test_a_stale_handle_still_takes_the_gpu_down_until_fetched_again(sim) -> None:  # type: ignore[no-untyped-def]
    """InvalidArgument on a handle that no longer resolves is the GPU gone: down, its
    handle dropped, and up again once a fresh handle answers."""
    s = sim(H100)
    assert s.at(1).gpu(1).up
    nvml = s.exporter.nvml
    nvml._handles[1] = ctypes.c_void_p(0xDEAD0000)  # no handle the library handed out
    snap = s.at(2)
    assert snap.gpu(0).up and not snap.gpu(1).up
    assert snap.gpu(1).get(Memory) is None
    counted = [line for line in s.text().splitlines() if 'error="InvalidArgument"' in line]
    assert 'llmgpu_exporter_collector_errors_total{collector="clocks",error="InvalidArgument"} 1.0' in counted
    assert not any('collector="clocks"' in line for line in counted if "nvml_call_errors" in line)
    assert s.at(3).gpu(1).up  # fetched again by index
