"""GPM activity per MIG GPU instance, through nvmlGpmMigSampleGet on the fake library."""

from __future__ import annotations

import pytest

from exporter.gpu_readings import MigProfiling
from exporter.sim import fakenvml

MIG = """
gpus: {count: 2, model: %s}
mig: {gpus: [1], instances: [{profile: 3g.40gb, memory_ratio: 0.5, sms: 66},
                             {profile: 3g.40gb, memory_ratio: 0.5, sms: 66}]}
phases: [{name: p, duration: 100, gpu: {util: 0.9, sm_active: 0.6, tensor_active: 0.4, dram_active: 0.3}}]
"""


def test_each_gpu_instance_gets_its_sm_tensor_and_dram_activity(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(MIG % "H100-80GB-SXM")
    s.at(5)  # the first sample of each instance: nothing to compare yet
    snap = s.at(10)
    mig = snap.gpu(1).get(MigProfiling)
    assert [i.gpu_instance for i in mig.instances] == [1, 2]
    for inst in mig.instances:
        assert inst.sm_active_ratio == pytest.approx(0.6, rel=0.05)
        assert inst.tensor_active_ratio == pytest.approx(0.4, rel=0.05)
        assert inst.dram_active_ratio == pytest.approx(0.3, rel=0.05)
    # GPU 0 is not in MIG mode: the family is absent there, not zero
    assert snap.gpu(0).get(MigProfiling) is None and snap.gpu(0).supported["gpm_mig"] is False
    text = s.text()
    assert 'llmgpu_gpu_mig_sm_active_ratio{gpu="1",gpu_instance="2"' in text
    assert 'llmgpu_gpu_mig_sm_active_ratio{gpu="0"' not in text
    # two buffers per GPU instance, besides the whole-GPU collector's two per GPU
    assert fakenvml.installed().gpm_samples_allocated == 2 * 2 + 2 * 2
    lib = fakenvml.installed()
    s.exporter.runner.stop()
    assert lib.gpm_samples_allocated == 0  # freed when the collectors stop


def test_no_gpm_no_per_instance_activity(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim((MIG % "A100-80GB-SXM").replace(", sm_active: 0.6, tensor_active: 0.4, dram_active: 0.3", ""))
    s.at(5)
    snap = s.at(10)
    assert snap.gpu(1).get(MigProfiling) is None and snap.gpu(1).supported["gpm_mig"] is False
    assert "llmgpu_gpu_mig_sm_active_ratio" not in s.text()
