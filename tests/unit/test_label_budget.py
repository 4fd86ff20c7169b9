"""The labels a series can carry stay within what a store takes: Mimir refuses a series
with more than 30 labels by default (its -validation.max-label-names-per-series), and
Prometheus adds `job` and `instance` to every scraped series."""

from __future__ import annotations

import re

import pytest

from exporter import catalog
from exporter.config import POD_LABELS_MAX, ConfigError, load
from exporter.metricdef import OWNER_LABELS

STORE_MAX = 30
TARGET_LABELS = ("job", "instance")
GPU_OWNER = (*OWNER_LABELS, "claim")  # what a GPU with one owner adds to each of its series


def most_labels() -> int:
    """The most labels a series of the exporter carries of its own, pod labels aside."""
    out = 0
    for _metric, labels, _family in catalog.rows():
        names = set(labels) | (set(GPU_OWNER) if "gpu" in labels else set())
        out = max(out, len(names))
    return out


def test_the_most_labels_a_series_can_carry_fit_a_store() -> None:
    own = most_labels()
    assert own >= 9  # a MIG instance's series on a claimed GPU: gpu, uuid, mig_uuid, ... claim
    assert own + POD_LABELS_MAX + len(TARGET_LABELS) <= STORE_MAX


def test_pod_labels_are_bounded_on_the_scrape(sim) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("grpc")
    many = ", ".join(f"k{i:02d}: v" for i in range(40))
    scenario = f"""
gpus: {{count: 1, model: L40S}}
engines: [{{name: chat, gpus: [0]}}]
sharing:
  mode: dra
  tenants: [{{name: noisy, gpus: [0], labels: {{{many}}}, sm: 0.2, memory: 0.1}}]
phases: [{{name: p, duration: 60, gpu: {{util: 0.5, memory_used_ratio: 0.5}}}}]
"""
    s = sim(scenario, pod_labels=".*", metric_profile="full")
    s.at(10)
    counts = [len(re.findall(r'\w+="', line)) for line in s.text().splitlines() if "{" in line]
    assert max(counts) + len(TARGET_LABELS) <= STORE_MAX
    copied = {m for line in s.text().splitlines() for m in re.findall(r"(label_k\d+)=", line)}
    assert copied == {f"label_k{i:02d}" for i in range(POD_LABELS_MAX)}  # the first 16 keys


def test_a_bad_allow_list_is_refused_with_its_reason() -> None:
    with pytest.raises(ConfigError, match=r"pod.labels.*regular expression"):
        load({"pod_labels": "team|("}, env={})
    with pytest.raises(ConfigError, match=r"pod.labels.max"):
        load({"pod_labels_max": POD_LABELS_MAX + 1}, env={})
