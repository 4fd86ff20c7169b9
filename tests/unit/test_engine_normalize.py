"""The normalizer on exposition pages of real and older vLLM, SGLang and TGI."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.engines.normalize import Normalized, Raw, detect, normalize

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ROOT / "tests" / "fixtures" / "engines"
VLLM = ROOT / "tests" / "fixtures" / "vllm"


def load(path: Path, kind: str | None = None) -> Normalized:
    families = list(text_string_to_metric_families(path.read_text()))
    result = normalize(families, kind)
    assert result is not None, path
    return result


def only(n: Normalized) -> Raw:
    assert len(n.series) == 1, list(n.series)
    return next(iter(n.series.values()))


def page_sum(text: str, name: str, **labels: str) -> float:
    """A value straight from the text, independently of the normalizer."""
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def real_vllm_pages() -> list[Path]:
    pages = sorted(VLLM.glob("vllm-0.32-*.txt"))
    assert pages, f"no captured vLLM pages in {VLLM} (tests/e2e/capture_fixtures.py makes them)"
    return pages


def test_real_vllm_pages_map_every_engine_field_onto_the_page_values() -> None:
    for page in real_vllm_pages():
        text = page.read_text()
        n = load(page)
        assert n.kind == "vllm"
        assert list(n.series) == [("tiny", None)], "one model, one engine index: no dp label"
        raw = only(n)
        v = raw.values
        assert v["requests_running"] == page_sum(text, "vllm:num_requests_running")
        assert v["kv_cache_usage_ratio"] == page_sum(text, "vllm:kv_cache_usage_perc")
        assert v["prompt_tokens"] == page_sum(text, "vllm:prompt_tokens_total")
        assert v["generation_tokens"] == page_sum(text, "vllm:generation_tokens_total")
        assert v["prefix_cache_queries"] == page_sum(text, "vllm:prefix_cache_queries_total")
        assert v["prefix_cache_hits"] == page_sum(text, "vllm:prefix_cache_hits_total")
        assert v["rejected_requests"] == page_sum(text, "vllm:admission_rejections_total")
        assert raw.maps["requests"]["length"] == page_sum(
            text, "vllm:request_success_total", finished_reason="length"
        )
        assert set(raw.maps["requests_waiting_by_reason"]) == {"capacity", "deferred"}
        ttft = raw.hists["ttft"]
        assert ttft.count == page_sum(text, "vllm:time_to_first_token_seconds_count")
        assert ttft.sum == pytest.approx(page_sum(text, "vllm:time_to_first_token_seconds_sum"))
        # bucket bounds kept as the engine has them, +Inf last
        bounds = [b for b, _ in ttft.buckets]
        assert bounds[:3] == [0.001, 0.005, 0.01] and math.isinf(bounds[-1])
        assert set(raw.hists) == {"ttft", "itl", "e2e", "queue", "prefill", "decode"}
        assert raw.cache_config is not None
        assert float(raw.cache_config["gpu_memory_utilization"]) > 0
        assert int(raw.cache_config["num_gpu_blocks"]) > 0
        assert "engine" not in raw.cache_config, "vLLM's engine index must not clash with our label"
        assert n.process_cpu_seconds == page_sum(text, "process_cpu_seconds_total")
        assert n.samples > 300


def test_loaded_vllm_page_shows_the_load() -> None:
    loaded = VLLM / "vllm-0.32-cpu-loaded.txt"
    if not loaded.exists():
        pytest.fail(f"{loaded} missing: run tests/e2e/capture_fixtures.py")
    raw = only(load(loaded))
    assert raw.values["generation_tokens"] > 0
    assert sum(raw.maps["requests"].values()) >= 8
    assert raw.hists["ttft"].count >= 8


def test_vllm_v0_names_are_read_when_the_current_ones_are_absent() -> None:
    raw = only(load(ENGINES / "vllm-0.6-old-names.txt"))
    assert raw.values["kv_cache_usage_ratio"] == 0.8125  # gpu_cache_usage_perc
    assert raw.hists["itl"].count == 50730  # time_per_output_token_seconds
    assert raw.maps["requests"] == {"stop": 412.0, "length": 88.0}
    assert "prefix_cache_queries" not in raw.values, "V0 has no prefix-cache counters: absent"
    assert raw.cache_config is not None and raw.cache_config["swap_space_bytes"] == "4294967296"
    assert "num_gpu_blocks_override" not in raw.cache_config  # not kept
    assert "sliding_window" not in raw.cache_config  # "None" values dropped


def test_early_v1_names_count_once_when_old_and_new_coexist() -> None:
    raw = only(load(ENGINES / "vllm-0.8-v1-old-names.txt"))
    assert raw.values["prefix_cache_queries"] == 9600  # gpu_prefix_cache_queries_total
    assert raw.values["prefix_cache_hits"] == 4800
    assert raw.values["kv_cache_usage_ratio"] == 0.25
    # inter_token_latency and the deprecated time_per_output_token both exist: one counts
    assert raw.hists["itl"].count == 2960


def test_data_parallel_ranks_get_a_dp_label_each() -> None:
    n = load(ENGINES / "vllm-0.32-dp2-specdecode.txt")
    model = "meta-llama/Llama-3.1-8B-Instruct"
    assert set(n.series) == {(model, "0"), (model, "1"), (model, None)}
    r0, r1 = n.series[(model, "0")], n.series[(model, "1")]
    assert (r0.values["requests_running"], r1.values["requests_running"]) == (30, 10)
    assert r0.values["spec_decode_accepted_tokens"] == 54000
    assert r1.values["spec_decode_draft_tokens"] == 60000
    assert r0.cache_config and r0.cache_config["num_gpu_blocks"] == "31000"
    # admission rejections carry no engine index: a model-level series of their own
    assert n.series[(model, None)].values == {"rejected_requests": 30.0}


def test_sglang_maps_onto_the_same_fields_and_skips_repeated_ranks() -> None:
    n = load(ENGINES / "sglang-0.5-tp2.txt")
    assert n.kind == "sglang"
    raw = only(n)
    v = raw.values
    assert v["requests_running"] == 18, "tp_rank 1 repeats rank 0 and must not be added"
    assert v["requests_waiting"] == 6
    assert v["kv_cache_usage_ratio"] == 0.72
    assert v["preemptions"] == 3  # retractions
    assert v["prompt_tokens_cached"] == 837840
    assert raw.maps["requests"] == {"finished": 4120.0}
    assert set(raw.hists) == {"ttft", "itl", "e2e", "queue"}
    assert "prefill" not in raw.hists and "rejected_requests" not in v  # no counterpart
    assert raw.cache_config == {"max_total_num_tokens": "209715"}


def test_tgi_maps_onto_the_same_fields_where_it_has_a_counterpart() -> None:
    n = load(ENGINES / "tgi-3.0-router.txt")
    assert n.kind == "tgi"
    assert list(n.series) == [(None, None)], "TGI pages carry no model label"
    raw = only(n)
    v = raw.values
    assert (v["requests_running"], v["requests_waiting"]) == (32, 5)
    assert v["prompt_tokens"] == 512300  # tgi_request_input_length_sum
    assert v["generation_tokens"] == 198700
    assert v["rejected_requests"] == 40  # err="overloaded"
    assert raw.maps["requests"] == {"success": 1250.0, "validation": 12.0, "dropped": 3.0}
    assert v["arrivals"] == 1310
    assert "ttft" not in raw.hists and "kv_cache_usage_ratio" not in v  # absent, not zero
    assert raw.hists["e2e"].count == 1250


def test_detection_by_metric_prefix_and_declared_type_wins() -> None:
    def fams(text: str) -> list:  # type: ignore[type-arg]
        return list(text_string_to_metric_families(text))

    assert detect(fams("vllm:num_requests_running 1\n")) == "vllm"
    assert detect(fams("sglang:num_running_reqs 1\nfoo 2\n")) == "sglang"
    assert detect(fams("tgi_queue_size 1\n")) == "tgi"
    assert detect(fams("node_load1 1\n")) is None
    assert normalize(fams("node_load1 1\n")) is None
    # a declared type reads only its own names
    declared = normalize(fams("vllm:num_requests_running 4\n"), "tgi")
    assert declared is not None and declared.kind == "tgi" and declared.series == {}


def test_untyped_counters_read_like_typed_ones() -> None:
    typed = "# TYPE tgi_request_count counter\ntgi_request_count 7\n"
    untyped = "tgi_request_count 7\ntgi_queue_size 1\n"
    a = normalize(list(text_string_to_metric_families(typed)), "tgi")
    b = normalize(list(text_string_to_metric_families(untyped)), "tgi")
    assert a is not None and b is not None
    assert only(a).values["arrivals"] == only(b).values["arrivals"] == 7


def test_non_finite_values_are_dropped() -> None:
    text = 'vllm:num_requests_running{model_name="m"} NaN\nvllm:num_requests_waiting{model_name="m"} 2\n'
    raw = only(normalize(list(text_string_to_metric_families(text))) or pytest.fail("none"))
    assert "requests_running" not in raw.values and raw.values["requests_waiting"] == 2
