"""dcgm-exporter pages: NVIDIA's own parse, profiling values land in the right fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.dcgm.fields import BY_TARGET, FIELDS
from exporter.dcgm.location import DcgmTargetError, normalize_url, pod_targets
from exporter.dcgm.scrape import read_page
from exporter.engines.fetch import parse
from exporter.gpu_readings import Profiling
from exporter.k8s.pods import PodInfo

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm-exporter"
A100_0 = "GPU-8f6a2c1e-5b0d-4c1f-9e2a-1d3b5c7e9f01"
MIG_GPU = "GPU-c3e5a7b9-d1f2-4a3b-8c4d-5e6f7a8b9c0d"


def page_of(text: str):  # type: ignore[no-untyped-def]
    return read_page(parse(text.encode(), 20000))


@pytest.mark.parametrize("name", ["readme-quickstart.txt", "server-test-expected.txt"])
def test_nvidias_recorded_pages_parse_and_carry_no_profiling(name: str) -> None:
    page = page_of((FIXTURES / name).read_text())
    assert page.samples >= 1 and page.gpus == {} and page.fields == frozenset()
    assert page.listed  # the GPU is listed (by its UUID label) without a profiling value


def test_the_readme_page_lists_its_gpu_by_uuid() -> None:
    page = page_of((FIXTURES / "readme-quickstart.txt").read_text())
    assert page.listed == {"GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"} and page.samples == 3


def test_every_profiling_field_lands_in_its_profiling_field_with_its_unit() -> None:
    page = page_of((FIXTURES / "composed-a100-profiling.txt").read_text())
    g = page.gpus[A100_0]
    assert g.gpu == "0" and g.model == "NVIDIA A100-SXM4-80GB" and g.hostname == "gpu-node-07"
    assert set(g.values) == set(BY_TARGET)  # all eleven
    assert g.values["sm_active_ratio"] == pytest.approx(0.612044)
    assert g.values["dram_active_ratio"] == pytest.approx(0.918226)
    assert g.values["tensor_active_ratio"] == pytest.approx(0.331506)
    assert g.values["pcie_tx_bytes_per_second"] == 201337804  # already bytes per second
    assert g.values["nvlink_rx_bytes_per_second"] == 69988104410
    assert Profiling(**g.values).fp64_active_ratio == 0.0
    assert page.fields == {f.dcgm for f in FIELDS}


def test_mig_instances_are_left_out_of_the_whole_gpu() -> None:
    page = page_of((FIXTURES / "composed-a100-profiling.txt").read_text())
    assert MIG_GPU not in page.gpus and MIG_GPU in page.listed
    assert page.mig_samples == 2 * len(FIELDS)  # two instances x every profiling field
    assert len(page.gpus) == 2


ROW = 'DCGM_FI_PROF_{f}{{gpu="0",{uuid}="GPU-1",device="nvidia0",modelName="NVIDIA L4",{host}="n"}} {v}\n'


def test_both_uuid_and_hostname_spellings_are_read() -> None:
    old = page_of(ROW.format(f="SM_ACTIVE", uuid="uuid", host="Hostname", v="0.5"))
    new = page_of(ROW.format(f="SM_ACTIVE", uuid="UUID", host="hostname", v="0.5"))
    assert old.gpus["GPU-1"].hostname == new.gpus["GPU-1"].hostname == "n"
    assert old.gpus["GPU-1"].values == new.gpus["GPU-1"].values == {"sm_active_ratio": 0.5}


def test_a_1x_compatibility_page_is_read_by_its_lower_case_names() -> None:
    """dcgm-exporter --use-old-namespace (etc/1.x-compatibility-metrics.csv) names the
    fields by go-dcgm's legacy names (pkg/dcgm/legacy_fields.csv) and the UUID `uuid`."""
    rows = "".join(
        f'dcgm_fi_prof_{name}{{gpu="0",uuid="GPU-1",device="nvidia0",modelName="NVIDIA A100"}} {v}\n'
        for name, v in (
            ("sm_active", 0.5),
            ("dram_active", 0.25),
            ("pipe_tensor_active", 0.125),
            ("pcie_tx_bytes", 1000),
            ("gr_engine_active", 0.9),
        )
    )
    page = page_of(rows)
    assert page.gpus["GPU-1"].values == {
        "sm_active_ratio": 0.5,
        "dram_active_ratio": 0.25,
        "tensor_active_ratio": 0.125,
        "pcie_tx_bytes_per_second": 1000,
    }
    assert page.fields == {
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
    }
    assert page_of(rows.replace("0.25", "25.0")).dropped == 1  # a percentage is still no ratio


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("SM_ACTIVE", "140737488355328.000000"),  # DCGM_FP64_BLANK
        ("PCIE_TX_BYTES", "9223372036854775794"),  # DCGM_INT64_NOT_SUPPORTED
        ("DRAM_ACTIVE", "37.5"),  # a percentage, not a ratio
        ("SM_ACTIVE", "-0.1"),
        ("SM_ACTIVE", "NaN"),
    ],
)
def test_a_blank_or_impossible_value_is_absent(field: str, value: str) -> None:
    page = page_of(ROW.format(f=field, uuid="UUID", host="hostname", v=value))
    assert page.gpus == {} and page.dropped == 1 and page.listed == {"GPU-1"}


def test_a_ratio_just_over_one_is_rounding_and_kept() -> None:
    page = page_of(ROW.format(f="SM_ACTIVE", uuid="UUID", host="hostname", v="1.000003"))
    assert page.gpus["GPU-1"].values["sm_active_ratio"] == pytest.approx(1.000003)


def test_sample_timestamps_give_the_oldest_per_gpu() -> None:
    text = (
        ROW.format(f="SM_ACTIVE", uuid="UUID", host="hostname", v="0.5 1700000000000").replace("\n", "")
        + "\n"
        + ROW.format(f="DRAM_ACTIVE", uuid="UUID", host="hostname", v="0.4 1700000030000")
    )
    assert page_of(text).gpus["GPU-1"].oldest_timestamp == 1700000000.0


@pytest.mark.parametrize(
    ("spec", "url"),
    [
        ("127.0.0.1:9400", "http://127.0.0.1:9400/metrics"),
        ("http://dcgm.gpu-operator:9400", "http://dcgm.gpu-operator:9400/metrics"),
        ("https://10.0.0.7:9400/metrics", "https://10.0.0.7:9400/metrics"),
        ("[fd00::7]:9400", "http://[fd00::7]:9400/metrics"),
    ],
)
def test_dcgm_exporter_urls(spec: str, url: str) -> None:
    assert normalize_url(spec) == url


@pytest.mark.parametrize("spec", ["ftp://x:1", "http://", "host:port"])
def test_a_bad_dcgm_exporter_url_is_refused(spec: str) -> None:
    with pytest.raises(DcgmTargetError, match="dcgm_exporter"):
        normalize_url(spec)


def pod(name: str, ip: str | None, container: str = "exporter", ns: str = "gpu-operator") -> PodInfo:
    return PodInfo(ns, name, f"uid-{name}", ip, {}, ((container, "c1"),))


def test_this_nodes_dcgm_exporter_pod_is_found_by_name_or_container() -> None:
    pods = [
        pod("vllm-70b-7d9f", "10.1.0.4", container="vllm"),
        pod("nvidia-dcgm-exporter-x2k4q", "10.1.0.9", container="nvidia-dcgm-exporter"),
        pod("telemetry-abc", "10.1.0.11", container="dcgm-exporter", ns="monitoring"),
        pod("dcgm-exporter-pending", None),
    ]
    assert [t.url for t in pod_targets(pods)] == [
        "http://10.1.0.9:9400/metrics",
        "http://10.1.0.11:9400/metrics",
    ]
    assert {t.source for t in pod_targets(pods)} == {"kubernetes"}
