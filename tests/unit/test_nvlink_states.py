"""NVLink's three states (nvml.h, CUDA 12.8+: INACTIVE 0, ACTIVE 1, SLEEP 2): a sleeping
link is neither down nor active, and never counted twice."""

from __future__ import annotations

import pytest

from exporter.gpu_readings import NvLink
from exporter.nvml import FI_NVLINK_GET_STATE, NVLINK_STATE_SLEEP
from exporter.nvml import const as N

SCENARIO = """
name: t
gpus: {count: 2, model: H100-80GB-SXM}
phases:
  - name: p
    duration: 1000
    gpu: {util: 0.5, nvlink_tx_bps: 1.0e+9}
    gpus: {1: {nvlink_links_sleeping: 2, nvlink_links_inactive: 1}}
"""


@pytest.mark.parametrize("profile", ["default", "full"])
def test_a_sleeping_link_is_neither_down_nor_two_links(sim, profile: str) -> None:  # type: ignore[no-untyped-def]
    s = sim(SCENARIO, metric_profile=profile)
    s.at(1)
    snap = s.at(2)
    awake, mixed = snap.gpu(0).get(NvLink), snap.gpu(1).get(NvLink)
    assert (awake.link_count, awake.links_up, awake.links_sleeping) == (18, 18, 0)
    assert (mixed.link_count, mixed.links_up, mixed.links_sleeping) == (18, 15, 2)
    ports = {p.link: p for p in mixed.links}
    assert [(ports[i].up, ports[i].sleeping) for i in (0, 14, 15, 16, 17)] == [
        (1, 0),
        (1, 0),
        (0, 0),  # trained down
        (0, 1),  # asleep
        (0, 1),
    ]
    text = s.text()
    uuid = snap.gpu(1).uuid
    assert f'llmgpu_gpu_nvlink_links_up{{gpu="1",uuid="{uuid}"}} 15.0' in text
    assert f'llmgpu_gpu_nvlink_links_sleeping{{gpu="1",uuid="{uuid}"}} 2.0' in text
    if profile == "full":
        assert f'llmgpu_gpu_nvlink_link_sleeping{{gpu="1",link="17",uuid="{uuid}"}} 1.0' in text
        assert f'llmgpu_gpu_nvlink_link_up{{gpu="1",link="17",uuid="{uuid}"}} 0.0' in text


def test_the_fake_answers_sleep_in_the_field_and_the_function(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(SCENARIO)
    s.at(1)
    nvml = s.exporter.nvml
    h = nvml.handle(1)
    got = nvml.field_values(
        h, [(FI_NVLINK_GET_STATE, 17), (FI_NVLINK_GET_STATE, 15), (FI_NVLINK_GET_STATE, 0)]
    )
    assert [got[(FI_NVLINK_GET_STATE, link)] for link in (17, 15, 0)] == [NVLINK_STATE_SLEEP, 0, 1]
    assert nvml.query(N.nvmlDeviceGetNvLinkState, h, 16) == NVLINK_STATE_SLEEP


def test_an_unknown_state_leaves_the_link_state_unknown() -> None:
    from exporter.collectors.nvlink import _port

    port = _port(3, 7)  # no state nvml.h names
    assert (port.up, port.sleeping) == (None, None)
    assert NvLink(links=(port,)).link_count is None  # no count from links of unknown state
