"""Engine targets from the configuration and the command line."""

from __future__ import annotations

import pytest

from exporter.collectors.engines import discoverers, targets_from_settings
from exporter.config import ConfigError, Settings
from exporter.engines.targets import Target, TargetError, parse_spec, spec_of


def test_plain_url() -> None:
    t = parse_spec("http://10.0.0.5:8000/metrics")
    assert (t.url, t.kind, t.name, t.pids) == ("http://10.0.0.5:8000/metrics", None, "10.0.0.5:8000", ())


def test_type_prefix_and_defaults_for_scheme_and_path() -> None:
    t = parse_spec("sglang=localhost:30000")
    assert t.kind == "sglang"
    assert t.url == "http://localhost:30000/metrics"
    assert t.name == "localhost:30000"
    assert t.is_local


def test_type_is_case_insensitive_and_checked() -> None:
    assert parse_spec("TGI=http://h:3000/metrics").kind == "tgi"
    with pytest.raises(TargetError, match="type must be one of"):
        parse_spec("triton=http://h:8000/metrics")


def test_ipv6_and_https_default_port() -> None:
    assert parse_spec("http://[fd00::1]:8000/metrics").name == "[fd00::1]:8000"
    assert parse_spec("https://engine.local/metrics").name == "engine.local:443"


def test_known_pids_travel_in_the_fragment_and_back() -> None:
    t = parse_spec("vllm=http://127.0.0.1:4711/metrics#pids=4000000,4000001")
    assert t.pids == (4000000, 4000001)
    assert t.url == "http://127.0.0.1:4711/metrics"  # the fragment is never sent
    assert parse_spec(spec_of(t)) == t


@pytest.mark.parametrize(
    "bad", ["", "ftp://h/metrics", "http://h:notaport/metrics", "http://h:1/m#foo=1", "http://h:1/#pids=a"]
)
def test_bad_targets_name_themselves(bad: str) -> None:
    with pytest.raises(TargetError):
        parse_spec(bad)


def test_loopback_spellings_share_one_key() -> None:
    keys = {parse_spec(u).key for u in ("localhost:8000", "127.0.0.1:8000", "http://0.0.0.0:8000/metrics")}
    assert len(keys) == 1
    assert parse_spec("127.0.0.1:8001").key not in keys


def test_settings_targets_and_a_bad_one_is_a_config_error() -> None:
    s = Settings(engines=("vllm=127.0.0.1:8000", "http://10.1.2.3:9000/metrics"))
    assert [t.kind for t in targets_from_settings(s)] == ["vllm", None]
    with pytest.raises(ConfigError, match="engines"):
        targets_from_settings(Settings(engines=("bogus=h:1",)))


def test_discovery_sources_follow_the_settings() -> None:
    assert len(discoverers(Settings(discover_processes=True))) == 1
    assert discoverers(Settings(discover_processes=False)) == []
    assert discoverers(Settings(simulate="healthy")) == [], "the demo shows simulated engines only"
    both = Settings(discover_processes=True, discover_kubernetes=True, node_name="gpu-7")
    assert len(discoverers(both)) == 2
    with pytest.raises(ConfigError, match="node_name"):
        discoverers(Settings(discover_kubernetes=True))


def test_target_is_hashable_and_frozen() -> None:
    t = Target(url="http://a:1/metrics")
    assert {t: 1}[t] == 1


def test_declared_limits_and_numa_travel_in_the_fragment_and_back() -> None:
    spec = (
        "vllm=http://127.0.0.1:4711/metrics#pids=4000000&numa=1&max_num_seqs=256&max_num_batched_tokens=8192"
    )
    t = parse_spec(spec)
    assert (t.pids, t.numa_nodes, t.max_num_seqs, t.max_num_batched_tokens) == ((4000000,), (1,), 256, 8192)
    assert parse_spec(spec_of(t)) == t


@pytest.mark.parametrize(
    "bad", ["http://h:1/#max_num_seqs=1,2", "http://h:1/#numa=x", "http://h:1/#pids=1&foo=2"]
)
def test_bad_declarations_are_refused(bad: str) -> None:
    with pytest.raises(TargetError):
        parse_spec(bad)
