"""A driver that goes away and comes back: the GPUs come back without a restart."""

from __future__ import annotations

import pynvml
import pytest

from exporter.gpu_readings import Memory, NvmlSession, Profiling, Xid
from exporter.nvml import NvmlError
from exporter.sim import fakenvml

SCENARIO = """
gpus: {count: 2, model: H100-80GB-SXM}
phases: [{name: p, duration: 200, gpu: {util: 0.8, memory_used_ratio: 0.5, sm_active: 0.6}}]
faults:
  - {kind: reload, at: 20, until: 40%s}
"""


@pytest.mark.parametrize("error", ["DriverNotLoaded", "LibRmVersionMismatch"])
def test_gpus_come_back_after_a_driver_reload(sim, error: str) -> None:  # type: ignore[no-untyped-def]
    s = sim(SCENARIO % f", error: {error}")
    s.at(5)
    assert s.at(10).gpu(0).get(Profiling).sm_active_ratio == pytest.approx(0.6, rel=0.05)
    away = s.at(25)
    assert not away.gpu(0).up and not away.gpu(1).up
    assert away.gpu(0).get(Memory) is None
    assert not s.at(30).gpu(0).up  # still away: the session is not rebuilt yet
    # Back: the session made before the reload answers Uninitialized to everything; the
    # exporter shuts NVML down, initialises it again and reads the GPUs with new handles.
    back = s.at(45)
    assert back.gpu(0).up and back.gpu(1).up
    assert back.gpu(0).get(Memory).used_bytes is not None
    assert back.get(NvmlSession).restarts == 1
    assert "llmgpu_exporter_nvml_restarts_total 1.0" in s.text()
    # GPM starts over on two new buffers per GPU. Freeing the old ones was tried before the
    # restart, but the driver was away and refused it: they are dropped, never reused
    snap = s.at(50)
    assert snap.gpu(0).get(Profiling).sm_active_ratio == pytest.approx(0.6, rel=0.05)
    assert fakenvml.installed().gpm_samples_allocated == 4 + 4
    s.at(60)
    assert fakenvml.installed().gpm_samples_allocated == 8  # and no more on later runs


def test_init_is_retried_with_a_backoff_while_the_driver_stays_away(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(SCENARIO % "")
    s.at(5)
    s.at(21)  # the loss is seen
    nvml = s.exporter.nvml
    inits = []
    real = nvml.recover

    def counted(now: float) -> bool:
        before = nvml._retry_at
        ok = real(now)
        if nvml._retry_at != before or ok:
            inits.append(now)
        return ok

    nvml.recover = counted  # type: ignore[method-assign]
    for t in range(22, 40):
        assert not s.at(t).gpu(0).up
    # one try per backoff step (1, 2, 4, 8 s ...), not one per collector per cycle
    assert 3 <= len(inits) <= 5, inits
    assert s.at(60).gpu(0).up and nvml.restarts == 1


def test_without_a_reload_nothing_restarts(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(SCENARIO.replace("faults:\n  - {kind: reload, at: 20, until: 40%s}\n", ""))
    for t in (5, 25, 45):
        assert s.at(t).gpu(0).up
    assert s.exporter.nvml.restarts == 0 and s.at(50).get(NvmlSession).restarts == 0


def test_xid_events_are_registered_again_on_the_new_session(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(
        SCENARIO % "" + "  - {kind: xid, gpu: 0, xid: 79, at: 50}\n  - {kind: xid, gpu: 1, xid: 13, at: 10}\n"
    )
    s.at(5)
    assert s.at(12).gpu(1).get(Xid).counts[13] == 1
    s.at(25)
    s.at(45)
    snap = s.at(55)
    assert snap.gpu(0).get(Xid).counts[79] == 1  # heard on the new event set
    assert snap.gpu(1).get(Xid).counts[13] == 1  # the count carried on


def test_no_restart_while_an_event_wait_of_the_old_session_runs(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(SCENARIO % "")
    nvml = s.exporter.nvml
    nvml.session_lost("DriverNotLoaded")
    nvml._waits = 1  # the XID thread is inside nvmlEventSetWait
    assert not nvml.recover(100.0) and nvml.lost == "DriverNotLoaded"
    nvml._waits = 0
    assert nvml.recover(100.0) and nvml.lost is None and nvml.generation == 1
    nvml.session_lost("Uninitialized")
    with pytest.raises(NvmlError):  # no new wait starts on a lost session
        nvml.blocking(pynvml.nvmlEventSetWait_v2, None, 0)
