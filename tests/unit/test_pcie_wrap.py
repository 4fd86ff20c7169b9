"""nvml.h: the PCIe byte counters (NVML_FI_DEV_PCIE_COUNT_TX_BYTES/RX_BYTES) "can be
wrapped". The exported counters never go back and never jump when the driver's wrap."""

from __future__ import annotations

from itertools import pairwise

from exporter.gpu_readings import Pcie

RATE = 1.0e9
WRAP = 3.5e9
SCENARIO = f"""
name: t
gpus: {{count: 1, model: H100-80GB-SXM}}
phases:
  - {{name: p, duration: 1000, gpu: {{pcie_tx_bps: {RATE:e}, pcie_counter_wrap: {WRAP:e}}}}}
"""


def test_a_wrapping_counter_never_goes_back_nor_jumps(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(SCENARIO)
    seen = []
    for t in range(1, 21):
        seen.append(s.at(float(t)).gpu(0).get(Pcie).tx_bytes)
    steps = [b - a for a, b in pairwise(seen)]
    assert all(d >= 0 for d in steps), f"went back: {seen}"
    assert all(d <= RATE * 1.01 for d in steps), f"jumped: {seen}"  # 1 s between reads
    wraps = int(20 * RATE // WRAP)
    assert wraps == 5
    # each wrap loses at most what a read interval carries; nothing is invented
    assert 20 * RATE - wraps * RATE <= seen[-1] <= 20 * RATE * 1.001
    text = s.text()
    assert 'llmgpu_gpu_pcie_tx_bytes_total{gpu="0"' in text


def test_the_counter_continues_across_a_gpu_that_went_down(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(SCENARIO + "faults:\n  - {kind: lost, gpu: 0, at: 3.5, until: 6.5}\n")
    before = s.at(3.0).gpu(0).get(Pcie).tx_bytes  # the driver's: 3e9, 1e9 at t=8
    assert not s.at(5.0).gpu(0).up
    after = s.at(8.0).gpu(0).get(Pcie).tx_bytes
    assert after >= before
