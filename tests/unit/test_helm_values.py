"""values.schema.json: wrong types and unknown keys are rejected by the render, with the key named."""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "llm-gpu-exporter"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())

# exporter settings the chart writes itself; values.config may hold only the others
MANAGED_SETTINGS = {
    "listen",
    "interval",
    "log_level",
    "engines",
    "discover_kubernetes",
    "engine_annotation",
    "probe_dir",
    "kubelet_socket",
    "web_config_file",
    "node_name",
    "process_owners",
    "pod_labels",
}


@pytest.fixture(scope="module")
def chart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # Schema checks do not need alerts/ or dashboards/: load a copy without those links,
    # so this file passes in a checkout where they do not exist yet.
    copy = tmp_path_factory.mktemp("chart") / CHART.name
    for path in CHART.rglob("*"):
        relative = path.relative_to(CHART)
        if relative.parts[0] in ("alerts", "dashboards"):
            continue
        if path.is_dir():
            (copy / relative).mkdir(parents=True, exist_ok=True)
        else:
            (copy / relative).parent.mkdir(parents=True, exist_ok=True)
            (copy / relative).write_bytes(path.read_bytes())
    loaded = helm.Chart.load(copy)
    yield loaded
    loaded.close()


REJECTED: list[tuple[dict[str, Any], str]] = [
    ({"interval": "fast"}, r"at '/interval': got string, want number"),
    ({"interval": 0.01}, r"at '/interval'"),
    ({"port": 70000}, r"at '/port'"),
    ({"replicas": 3}, r"additional properties 'replicas' not allowed"),
    ({"image": {"repository": "x", "tags": "v1"}}, r"at '/image': additional properties 'tags'"),
    ({"image": {"digest": "latest"}}, r"at '/image/digest'"),
    ({"attribution": {"enabled": "yes"}}, r"at '/attribution/enabled': got string, want boolean"),
    ({"attribution": {"podResourcesDir": "relative/dir"}}, r"at '/attribution/podResourcesDir'"),
    ({"extraArgs": "--simulate healthy"}, r"at '/extraArgs': got string, want array"),
    ({"extraArgs": [1]}, r"at '/extraArgs/0': got number, want string"),
    ({"extraEnv": [{"value": "x"}]}, r"at '/extraEnv/0': missing property 'name'"),
    ({"config": {"interval": 2}}, r"at '/config': additional properties 'interval' not allowed"),
    ({"config": {"no_such_setting": 1}}, r"additional properties 'no_such_setting'"),
    ({"config": {"engine_interval": "5s"}}, r"at '/config/engine_interval'"),
    ({"tolerations": [{"key": "a", "operatr": "Exists"}]}, r"at '/tolerations/0'"),
    ({"tolerations": [{"effect": "Sometimes"}]}, r"at '/tolerations/0/effect'"),
    ({"serviceMonitor": {"interval": "15 seconds"}}, r"at '/serviceMonitor/interval'"),
    ({"serviceMonitor": {"labels": {"release": 1}}}, r"at '/serviceMonitor/labels/release'"),
    ({"podMonitor": {"relabelings": [{"action": "rename"}]}}, r"/podMonitor/relabelings/0/action"),
    ({"securityContext": {"runAsRoot": True}}, r"at '/securityContext'"),
    ({"podSecurityContext": {"seccompProfile": {"type": "Custom"}}}, r"seccompProfile/type"),
    ({"resources": {"limits": {"memory": "lots"}}}, r"at '/resources/limits/memory'"),
    ({"resources": {"limit": {"memory": "1Gi"}}}, r"additional properties 'limit'"),
    ({"webConfig": {"scheme": "ftp"}}, r"at '/webConfig/scheme'"),
    ({"discovery": {"annotation": "not a key"}}, r"at '/discovery/annotation'"),
    ({"gpuNodeAffinity": {"terms": [{"key": "k", "operator": "Like"}]}}, r"/operator"),
    ({"logLevel": "verbose"}, r"at '/logLevel'"),
    ({"tolerateAllNoSchedule": "yes"}, r"at '/tolerateAllNoSchedule': got string, want boolean"),
    ({"prometheus": {"release": "kube prometheus"}}, r"at '/prometheus/release'"),
    ({"prometheus": {"releases": "kps"}}, r"at '/prometheus': additional properties 'releases'"),
    ({"serviceMonitor": {"sampleLimit": -1}}, r"at '/serviceMonitor/sampleLimit'"),
    ({"serviceMonitor": {"sampleLimit": "10k"}}, r"at '/serviceMonitor/sampleLimit'"),
    (
        {"serviceMonitor": {"targetLabels": "team"}},
        r"at '/serviceMonitor/targetLabels': got string, want array",
    ),
    ({"podMonitor": {"targetLabels": ["not a label"]}}, r"at '/podMonitor/targetLabels/0'"),
    ({"podMonitor": {"jobLabel": "app name"}}, r"at '/podMonitor/jobLabel'"),
    ({"prometheusRule": {"runbookBaseUrl": "docs/runbooks.md"}}, r"at '/prometheusRule/runbookBaseUrl'"),
    (
        {"prometheusRule": {"runbookBaseUrl": "https://example.com/runbooks.md#top"}},
        r"at '/prometheusRule/runbookBaseUrl'",
    ),
    ({"prometheusRule": {"job": ""}}, r"at '/prometheusRule/job'"),
    (
        {"prometheusRule": {"thresholds": {"smActiveRatio": 95}}},
        r"at '/prometheusRule/thresholds/smActiveRatio'",
    ),
    ({"prometheusRule": {"thresholds": {"smActive": 0.9}}}, r"additional properties 'smActive'"),
    ({"prometheusRule": {"ttftSlo": {"objective": 1}}}, r"at '/prometheusRule/ttftSlo/objective'"),
    ({"prometheusRule": {"ttftSlo": {"seconds": 0}}}, r"at '/prometheusRule/ttftSlo/seconds'"),
    (
        {"prometheusRule": {"ttftSlo": {"bucketBelow": 0.1}}},
        r"at '/prometheusRule/ttftSlo/bucketBelow': got number",
    ),
    ({"prometheusRule": {"ttftSlo": {"bucketAbove": "+Inf"}}}, r"at '/prometheusRule/ttftSlo/bucketAbove'"),
]


@pytest.mark.parametrize(("values", "message"), REJECTED, ids=[m for _, m in REJECTED])
def test_render_rejects_values_outside_the_schema(chart: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        chart.render(values, name="gpu", namespace="monitoring")
    text = str(caught.value)
    assert "values don't meet the specifications of the schema" in text
    assert re.search(message, text), text


def test_lint_reports_values_outside_the_schema() -> None:
    if not all((CHART / name).exists() for name in ("alerts", "dashboards")):
        pytest.skip("alerts/ or dashboards/ is not in this checkout yet")
    report = helm.lint(CHART, {"interval": "fast"})
    errors = [m["error"] for m in report["messages"] if m["severity"] == 3]
    assert any("at '/interval': got string, want number" in e for e in errors), report


def test_validate_schema_agrees_with_render(chart: Any) -> None:
    chart.validate_schema({})
    with pytest.raises(helm.HelmValuesError, match="replicas"):
        chart.validate_schema({"replicas": 3})


def test_defaults_and_documented_values_pass(chart: Any) -> None:
    chart.validate_schema({})
    chart.validate_schema(
        {
            "config": {"engine_interval": 5, "simulate": "healthy", "collectors_enabled": ["x"]},
            "resources": {"limits": {"cpu": 1, "memory": "1Gi", "nvidia.com/gpu": 0}},
            "priorityClass": {"create": False},
            "priorityClassName": "system-node-critical",
            "tolerateAllNoSchedule": False,
            "prometheus": {"release": "kube-prometheus-stack"},
            "serviceMonitor": {
                "jobLabel": "app.kubernetes.io/name",
                "targetLabels": ["team"],
                "sampleLimit": 1,
            },
            "prometheusRule": {
                "job": "monitoring/gpu-exporter",
                "runbookBaseUrl": "https://github.com/acme/llm-gpu-exporter/blob/v0.1.0/docs/runbooks.md",
                "thresholds": {"nvLinkErrors": 100, "collectorSampleAgeSeconds": 30.5},
                "ttftSlo": {"seconds": 2, "objective": 0.999, "bucketBelow": "1.0", "bucketAbove": "2.5"},
            },
        }
    )


# Kubernetes objects passed through whole: one README row each, their fields are Kubernetes'
PASS_THROUGH = {"podSecurityContext", "securityContext", "resources", "affinity", "updateStrategy"}


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        return SCHEMA["definitions"][node["$ref"].rsplit("/", 1)[1]] | node
    return node


def _groups(node: dict[str, Any], prefix: str = "") -> set[str]:
    """Value paths that are groups of documented keys (closed objects of the chart's own)."""
    groups: set[str] = set()
    for key, sub in node.get("properties", {}).items():
        path, sub = f"{prefix}{key}", _resolve(sub)
        closed = sub.get("type") == "object" and sub.get("additionalProperties") is False
        if closed and path not in PASS_THROUGH and path != "config":
            groups |= {path} | _groups(sub, path + ".")
    return groups


GROUPS = _groups(SCHEMA)


def _keys(tree: dict[str, Any], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for key, sub in tree.items():
        path = f"{prefix}{key}"
        if path in GROUPS:
            keys |= _keys(sub.get("properties", sub), path + ".")
        else:
            keys.add(path)
    return keys


def test_every_schema_key_has_a_default_and_a_readme_row() -> None:
    schema_keys = _keys({k: _resolve(v) for k, v in SCHEMA["properties"].items()}) - {"global"}
    assert _keys(VALUES) == schema_keys
    readme = (CHART / "README.md").read_text()
    rows = set(re.findall(r"^\| `([^`]+)` \|", readme, flags=re.MULTILINE))
    missing, extra = schema_keys - rows, rows - schema_keys
    assert not missing and not extra, f"README values table: missing {missing}, extra {extra}"


def test_config_schema_covers_exactly_the_exporter_settings() -> None:
    config = pytest.importorskip("exporter.config")
    allowed = SCHEMA["properties"]["config"]["properties"]
    assert set(allowed) | MANAGED_SETTINGS == set(config.FIELDS), (
        "values.schema.json config keys are out of step with exporter/config.py Settings"
    )
    assert not set(allowed) & MANAGED_SETTINGS
    json_types = {str: "string", float: "number", int: "integer", bool: "boolean"}
    for key, spec in allowed.items():
        hint = config.FIELDS[key]
        origin = typing.get_origin(hint)
        if origin is tuple:
            assert spec["type"] == "array", key
        elif origin is typing.Literal:
            assert spec["type"] == "string" and set(spec["enum"]) == set(typing.get_args(hint)), key
        elif hint in json_types:
            assert spec["type"] == json_types[hint], key
        else:  # Optional[...]
            assert "null" in spec["type"], key


def test_config_schema_ranges_are_the_settings_ranges() -> None:
    """A value the exporter refuses at start (exit 2, a pod in CrashLoopBackOff) is
    refused by `helm install` first: the schema's bounds are the settings' own."""
    config = pytest.importorskip("exporter.config")
    names = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum"}
    for key, spec in SCHEMA["properties"]["config"]["properties"].items():
        bounds = config.bounds(config.Settings.model_fields[key]) if key in config.NUMBERS else {}
        want = {names[k]: v for k, v in bounds.items() if k in names}
        got = {k: v for k, v in spec.items() if k in names.values()}
        assert got == want, key
