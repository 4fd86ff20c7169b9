"""The Helm chart, rendered with the Helm v4 engine (helm-python-sdk) and checked object by object.

Core kinds are validated with kubernetes-validate --strict for Kubernetes 1.29 and 1.32.
ServiceMonitor, PodMonitor and PrometheusRule are CRDs that kubernetes-validate has no
schema for: they are checked against the subset of the monitoring.coreos.com/v1 schemas
written below (the fields the chart emits, unknown fields rejected). PrometheusRule groups
go through `promtool check rules`, dashboard ConfigMaps must hold valid JSON.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "llm-gpu-exporter"
KUBE_VERSIONS = ("1.29", "1.32")
RELEASE, NAMESPACE = "gpu", "monitoring"
FULLNAME = f"{RELEASE}-llm-gpu-exporter"
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
SHARED = ("alerts", "dashboards")  # chart entries that are symlinks into the repository

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "monitors-off": {
        "service": {"enabled": False},
        "serviceMonitor": {"enabled": False},
        "podMonitor": {"enabled": False},
        "prometheusRule": {"enabled": False},
        "dashboards": {"enabled": False},
    },
    "attribution-on": {
        "attribution": {"enabled": True},
        "discovery": {"kubernetes": True, "annotation": "prometheus.io/scrape"},
        "probeDir": {"enabled": True},
    },
    "custom-selectors": {
        "gpuNodeAffinity": {"enabled": False},
        "nodeSelector": {"node.example.com/pool": "h100", "kubernetes.io/os": "linux"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "nvidia.com/gpu.product",
                                    "operator": "In",
                                    "values": ["NVIDIA-H100-80GB-HBM3"],
                                }
                            ]
                        }
                    ]
                }
            }
        },
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"},
            {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        ],
        "priorityClass": {"create": False},
        "priorityClassName": "system-node-critical",
        "runtimeClassName": "nvidia",
    },
    "extra-args": {
        "extraArgs": ["--simulate", "healthy"],
        "extraEnv": [
            {"name": "LLMGPU_LOG_LEVEL", "value": "debug"},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        "engines": ["vllm=http://127.0.0.1:8000/metrics"],
        "interval": 0.5,
        "config": {"engine_interval": 2, "collectors_disabled": ["host"]},
        "extraVolumes": [{"name": "scratch", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        "image": {
            "repository": "registry.example.com/llm-gpu-exporter",
            "digest": "sha256:" + "a" * 64,
        },
        "resources": {"requests": {"cpu": "100m", "memory": "200Mi"}, "limits": {"memory": "1Gi"}},
    },
    "podmonitor-tls": {
        "commonLabels": {"team": "inference"},
        "serviceMonitor": {"enabled": False},
        "podMonitor": {
            "enabled": True,
            "namespace": "observability",
            "labels": {"release": "kube-prometheus-stack"},
            "interval": "30s",
            "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "pod"}],
            "metricRelabelings": [{"action": "drop", "regex": "llmgpu_exporter_.*"}],
            "tlsConfig": {"insecureSkipVerify": True},
        },
        "prometheusRule": {"labels": {"release": "kube-prometheus-stack"}},
        "dashboards": {
            "namespace": "grafana",
            "labelValue": "gpu",
            "annotations": {"grafana_folder": "GPU"},
        },
        "webConfig": {"existingSecret": "exporter-web", "scheme": "HTTPS"},
        "serviceAccount": {"create": False, "name": "gpu-monitoring"},
    },
}


# --- the chart directory -------------------------------------------------------------------


@pytest.fixture(scope="session")
def chart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart; where alerts/ or dashboards/ is not in this checkout yet (a fresh clone
    before any file landed there), a copy whose missing link target is an empty directory."""
    helm.disable_logging()
    if all((CHART / name).exists() for name in SHARED):
        return CHART
    copy = tmp_path_factory.mktemp("chart") / CHART.name
    shutil.copytree(CHART, copy, symlinks=True)
    for name in SHARED:
        if not (copy / name).exists():
            (copy / name).unlink()
            (copy / name).mkdir()
        else:
            target = (CHART / name).resolve()
            (copy / name).unlink()
            (copy / name).symlink_to(target)
    return copy


@pytest.fixture(scope="session")
def chart(chart_dir: Path) -> Iterator[Any]:
    loaded = helm.Chart.load(chart_dir)
    yield loaded
    loaded.close()


RENDER_SECONDS: dict[str, float] = {}


def render(chart: Any, values: dict[str, Any]) -> list[dict[str, Any]]:
    began = time.perf_counter()
    manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    RENDER_SECONDS[json.dumps(values, sort_keys=True)] = time.perf_counter() - began
    docs: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if not path.endswith((".yaml", ".yml")):
            continue
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = by_kind(docs, kind)
    return doc


# --- CRD subsets (monitoring.coreos.com/v1) ------------------------------------------------

DURATION = "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
LABEL_NAME = "^[a-zA-Z_][a-zA-Z0-9_]*$"
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
    "additionalProperties": False,
}
RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": LABEL_NAME}},
        "separator": {"type": "string"},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "modulus": {"type": "integer"},
        "replacement": {"type": "string"},
        "action": {
            "type": "string",
            "enum": [
                *(
                    a
                    for name in (
                        "replace", "keep", "drop", "hashmod", "labelmap", "labeldrop",
                        "labelkeep", "lowercase", "uppercase", "keepequal", "dropequal",
                    )
                    for a in (name, name.capitalize())
                ),
                "HashMod", "LabelMap", "LabelDrop", "LabelKeep", "KeepEqual", "DropEqual",
            ],
        },
    },
}  # fmt: skip
ENDPOINT = {
    "type": "object",
    "required": ["port"],
    "additionalProperties": False,
    "properties": {
        "port": {"type": "string"},
        "path": {"type": "string"},
        "scheme": {"type": "string", "enum": ["http", "https", "HTTP", "HTTPS"]},
        "interval": {"type": "string", "pattern": DURATION},
        "scrapeTimeout": {"type": "string", "pattern": DURATION},
        "honorLabels": {"type": "boolean"},
        "tlsConfig": {"type": "object"},
        "relabelings": {"type": "array", "items": RELABEL},
        "metricRelabelings": {"type": "array", "items": RELABEL},
    },
}
SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"matchLabels": STRING_MAP, "matchExpressions": {"type": "array"}},
}
NAMESPACE_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}},
}


def _crd(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"type": "string"},
            "metadata": METADATA,
            "spec": spec,
        },
    }


RULE = {
    "type": "object",
    "required": ["expr"],
    "additionalProperties": False,
    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
    "properties": {
        "alert": {"type": "string"},
        "record": {"type": "string"},
        "expr": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        "for": {"type": "string", "pattern": DURATION},
        "keep_firing_for": {"type": "string", "pattern": DURATION},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}
CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": _crd(
        {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": SELECTOR,
                "namespaceSelector": NAMESPACE_SELECTOR,
                "endpoints": {"type": "array", "minItems": 1, "items": ENDPOINT},
            },
        }
    ),
    "PodMonitor": _crd(
        {
            "type": "object",
            "required": ["selector", "podMetricsEndpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": SELECTOR,
                "namespaceSelector": NAMESPACE_SELECTOR,
                "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": ENDPOINT},
            },
        }
    ),
    "PrometheusRule": _crd(
        {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": DURATION},
                            "query_offset": {"type": "string", "pattern": DURATION},
                            "limit": {"type": "integer"},
                            "partial_response_strategy": {"type": "string"},
                            "labels": STRING_MAP,
                            "rules": {"type": "array", "items": RULE},
                        },
                    },
                }
            },
        }
    ),
}

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def check_metadata(doc: dict[str, Any]) -> None:
    """What the JSON schemas leave out: object names and label syntax."""
    meta = doc["metadata"]
    assert DNS_SUBDOMAIN.match(meta["name"]) and len(meta["name"]) <= 253, meta["name"]
    if doc["kind"] in {"Service", "DaemonSet"}:
        assert len(meta["name"]) <= 63
    labels = dict(meta.get("labels") or {})
    if doc["kind"] == "DaemonSet":
        labels.update(doc["spec"]["template"]["metadata"]["labels"])
    for key, value in labels.items():
        assert LABEL_KEY.match(key), key
        assert isinstance(value, str) and len(value) <= 63 and LABEL_VALUE.match(value), value


def validate_all(docs: list[dict[str, Any]]) -> int:
    """Validate every object; returns how many validations ran."""
    count = 0
    for doc in docs:
        check_metadata(doc)
        if doc["kind"] in CRD_KINDS:
            jsonschema.validate(doc, CRD_SCHEMAS[doc["kind"]])
            count += 1
            continue
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
            count += 1
    return count


def promtool_check(groups: list[dict[str, Any]], tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def daemonset_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return pod


def exporter_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = daemonset_pod(docs)["containers"]
    assert container["name"] == "exporter"
    return dict(container)


def config_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    cm = next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == FULLNAME)
    config: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return config


# --- every variant -------------------------------------------------------------------------

VALIDATED: dict[str, int] = {}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_renders_lints_and_validates(
    chart: Any, chart_dir: Path, variant: str, tmp_path: Path
) -> None:
    values = VARIANTS[variant]
    docs = render(chart, values)
    assert by_kind(docs, "DaemonSet"), "no DaemonSet rendered"
    for version in KUBE_VERSIONS:
        report = helm.lint(chart_dir, values, namespace=NAMESPACE, kube_version=f"v{version}.0", strict=True)
        errors = [m for m in report["messages"] if m["severity"] >= 2]  # warnings count too
        assert not errors and not report["errors"], report
    VALIDATED[variant] = validate_all(docs)
    groups = [g for rule in by_kind(docs, "PrometheusRule") for g in rule["spec"]["groups"]]
    if groups:
        promtool_check(groups, tmp_path)
    for cm in by_kind(docs, "ConfigMap"):
        for key, text in cm.get("data", {}).items():
            if key.endswith(".json"):
                try:
                    dashboard = json.loads(text)
                except json.JSONDecodeError as err:
                    pytest.fail(f"dashboard {key} in ConfigMap {cm['metadata']['name']}: {err}")
                assert isinstance(dashboard, dict), f"{key} is not a JSON object"


def test_render_is_fast(chart: Any) -> None:
    began = time.perf_counter()
    for values in VARIANTS.values():
        render(chart, values)
    elapsed = time.perf_counter() - began
    assert elapsed < 10 * len(VARIANTS), elapsed
    print(f"rendered {len(VARIANTS)} variants in {elapsed * 1000:.1f} ms")


def test_rendered_config_is_accepted_by_the_exporter(chart: Any, tmp_path: Path) -> None:
    config = pytest.importorskip("exporter.config")
    for name, values in VARIANTS.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config_of(render(chart, values))))
        settings = config.load({}, config_file=str(path), env={"NODE_NAME": "gpu-node-1"})
        assert settings.port == 9445
        assert settings.node_name == "gpu-node-1"


# --- what each variant must say ------------------------------------------------------------


def assert_restricted_pod_security(pod: dict[str, Any]) -> None:
    """The Pod Security Standard `restricted` profile, as far as a manifest shows it."""
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    assert not any("hostPath" in volume for volume in pod.get("volumes", []))
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for container in pod["containers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert not sc.get("privileged")
        assert "ports" not in container or all("hostPort" not in p for p in container["ports"])


def test_default_is_a_locked_down_daemonset_on_gpu_nodes(chart: Any) -> None:
    docs = render(chart, {})
    pod = daemonset_pod(docs)
    assert_restricted_pod_security(pod)
    container = exporter_container(docs)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["automountServiceAccountToken"] is False
    assert one(docs, "ServiceAccount")["automountServiceAccountToken"] is False
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = [t["matchExpressions"][0]["key"] for t in terms["nodeSelectorTerms"]]
    assert keys == ["nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["priorityClassName"] == one(docs, "PriorityClass")["metadata"]["name"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # the exporter never asks for a GPU: it must not take one away from the workloads
    assert "nvidia.com/gpu" not in json.dumps(container.get("resources", {}))
    assert container["args"] == ["serve", "--config=/etc/llm-gpu-exporter/config.yaml"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    service = one(docs, "Service")
    assert service["spec"]["clusterIP"] == "None"
    monitor = one(docs, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert not by_kind(docs, "PodMonitor")
    config = config_of(docs)
    assert config["listen"] == "0.0.0.0:9445" and config["interval"] == 1
    assert "kubelet_socket" not in config


def test_monitors_off(chart: Any) -> None:
    docs = render(chart, VARIANTS["monitors-off"])
    kinds = {doc["kind"] for doc in docs}
    assert not kinds & CRD_KINDS
    assert "Service" not in kinds
    assert [cm["metadata"]["name"] for cm in by_kind(docs, "ConfigMap")] == [FULLNAME]


def test_attribution_and_discovery(chart: Any) -> None:
    docs = render(chart, VARIANTS["attribution-on"])
    pod = daemonset_pod(docs)
    container = exporter_container(docs)
    assert pod["hostPID"] is True
    assert pod["hostNetwork"] is False
    assert pod["automountServiceAccountToken"] is True
    assert pod["securityContext"]["runAsUser"] == 0
    assert pod["securityContext"]["runAsNonRoot"] is False
    # root, but still without capabilities, privilege escalation or a writable root
    sc = container["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert volumes["pod-resources"]["hostPath"] == {
        "path": "/var/lib/kubelet/pod-resources",
        "type": "Directory",
    }
    assert mounts["pod-resources"]["readOnly"] is True
    assert volumes["probes"]["hostPath"]["path"] == "/run/llm-gpu-exporter/probes"
    assert mounts["probes"] == {
        "name": "probes",
        "mountPath": "/run/llm-gpu-exporter/probes",
        "readOnly": True,
    }
    config = config_of(docs)
    assert config["kubelet_socket"] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert config["discover_kubernetes"] is True
    assert config["engine_annotation"] == "prometheus.io/scrape"
    role = one(docs, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}
    ]


def test_attribution_alone_needs_no_api_access(chart: Any) -> None:
    docs = render(chart, {"attribution": {"enabled": True}})
    pod = daemonset_pod(docs)
    assert pod["hostPID"] is True
    assert pod["automountServiceAccountToken"] is False
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    assert "kubelet_socket" in config_of(docs)


def test_discovery_alone_needs_rbac_but_not_host_access(chart: Any) -> None:
    docs = render(chart, {"discovery": {"kubernetes": True}})
    assert_restricted_pod_security(daemonset_pod(docs))
    assert daemonset_pod(docs)["automountServiceAccountToken"] is True
    assert one(docs, "ClusterRole")["rules"][0]["verbs"] == ["list"]
    assert not by_kind(
        render(chart, {"discovery": {"kubernetes": True}, "rbac": {"create": False}}), "ClusterRole"
    )


def test_custom_selectors(chart: Any) -> None:
    docs = render(chart, VARIANTS["custom-selectors"])
    pod = daemonset_pod(docs)
    assert pod["nodeSelector"] == {"node.example.com/pool": "h100", "kubernetes.io/os": "linux"}
    expr = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert expr["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.product"
    assert len(pod["tolerations"]) == 2
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["runtimeClassName"] == "nvidia"
    assert not by_kind(docs, "PriorityClass")
    # an affinity without nodeAffinity keeps the GPU-node rule beside it
    anti = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    pod = daemonset_pod(render(chart, {"affinity": anti}))
    assert set(pod["affinity"]) == {"nodeAffinity", "podAntiAffinity"}


def test_extra_args_env_and_config(chart: Any) -> None:
    docs = render(chart, VARIANTS["extra-args"])
    container = exporter_container(docs)
    assert container["args"] == [
        "serve",
        "--config=/etc/llm-gpu-exporter/config.yaml",
        "--simulate",
        "healthy",
    ]
    assert container["image"] == "registry.example.com/llm-gpu-exporter@sha256:" + "a" * 64
    env = {e["name"] for e in container["env"]}
    assert {"LLMGPU_LOG_LEVEL", "POD_IP", "NODE_NAME"} <= env
    assert {"name": "scratch", "mountPath": "/scratch"} in container["volumeMounts"]
    config = config_of(docs)
    assert config["engines"] == ["vllm=http://127.0.0.1:8000/metrics"]
    assert config["interval"] == 0.5
    assert config["engine_interval"] == 2 and config["collectors_disabled"] == ["host"]
    # the pod rolls when the config changes
    before = one(render(chart, {}), "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    after = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert before["checksum/config"] != after["checksum/config"]


def test_podmonitor_labels_namespaces_and_tls(chart: Any) -> None:
    docs = render(chart, VARIANTS["podmonitor-tls"])
    assert not by_kind(docs, "ServiceMonitor") and not by_kind(docs, "ServiceAccount")
    monitor = one(docs, "PodMonitor")
    assert monitor["metadata"]["namespace"] == "observability"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["metadata"]["labels"]["team"] == "inference"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["scheme"] == "https" and endpoint["interval"] == "30s"
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    assert endpoint["relabelings"][-1]["targetLabel"] == "pod"
    pod = daemonset_pod(docs)
    assert pod["serviceAccountName"] == "gpu-monitoring"
    container = exporter_container(docs)
    assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert {"name": "web-config", "secret": {"secretName": "exporter-web"}} in pod["volumes"]
    assert config_of(docs)["web_config_file"] == "/etc/llm-gpu-exporter/web/web-config.yml"
    for rule in by_kind(docs, "PrometheusRule"):
        assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    for cm in by_kind(docs, "ConfigMap"):
        if cm["metadata"]["name"] != FULLNAME:
            assert cm["metadata"]["namespace"] == "grafana"
            assert cm["metadata"]["labels"]["grafana_dashboard"] == "gpu"
            assert cm["metadata"]["annotations"]["grafana_folder"] == "GPU"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"service": {"enabled": False}}, "serviceMonitor.enabled needs service.enabled"),
        ({"podMonitor": {"enabled": True}}, "scrape every exporter twice"),
    ],
)
def test_contradictory_values_fail_with_a_message(chart: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_notes_mention_the_trade_off(chart: Any) -> None:
    notes = chart.render(VARIANTS["attribution-on"], name=RELEASE, namespace=NAMESPACE)
    text = next(v for k, v in notes.items() if k.endswith("NOTES.txt"))
    assert "host PID namespace" in text and "kubelet socket" in text
    default = chart.render({}, name=RELEASE, namespace=NAMESPACE)
    assert "Pod attribution is off" in next(v for k, v in default.items() if k.endswith("NOTES.txt"))


# --- one source for alerts and dashboards --------------------------------------------------


def repo_rule_files() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((ROOT / "alerts").glob("*.rules.yml"))}


def repo_dashboard_files() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((ROOT / "dashboards").glob("*.json"))}


def test_chart_links_to_the_repository_instead_of_copying() -> None:
    for name in SHARED:
        link = CHART / name
        assert link.is_symlink(), f"{link} must be a symlink to ../../{name}"
        assert os.readlink(link) == f"../../{name}"
    for path in CHART.rglob("*"):  # rglob does not descend into the symlinked directories
        if path.is_file():
            assert not path.name.endswith((".rules.yml", ".json")) or path.name == ("values.schema.json"), (
                f"{path} looks like a copy of a repository file"
            )


def test_chart_carries_exactly_the_repository_rules_and_dashboards(chart: Any, tmp_path: Path) -> None:
    rules, dashboards = repo_rule_files(), repo_dashboard_files()
    # what the Helm loader put into the chart
    files = {f["name"] for f in chart.files}
    assert {n.split("/", 1)[1] for n in files if n.startswith("alerts/") and n.endswith(".rules.yml")} == set(
        rules
    )
    assert {n.split("/", 1)[1] for n in files if re.match(r"^dashboards/[^/]+\.json$", n)} == set(dashboards)
    assert not [n for n in files if n.startswith(("alerts/tests/", "dashboards/")) and n.endswith(".py")]
    # what the release installs
    docs = render(chart, {})
    rendered_rules = {
        Path(d["metadata"]["annotations"]["llm-gpu-exporter.io/source"]).name: d
        for d in by_kind(docs, "PrometheusRule")
    }
    expected_rules = {name for name, text in rules.items() if text.strip()}
    assert set(rendered_rules) == expected_rules
    for name, doc in rendered_rules.items():
        assert doc["spec"] == yaml.safe_load(rules[name]), name
    rendered_dashboards = {
        Path(d["metadata"]["annotations"]["llm-gpu-exporter.io/source"]).name: d
        for d in by_kind(docs, "ConfigMap")
        if "llm-gpu-exporter.io/source" in d["metadata"].get("annotations", {})
    }
    assert set(rendered_dashboards) == set(dashboards)
    for name, doc in rendered_dashboards.items():
        assert doc["data"] == {name: dashboards[name]}, name
        assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert len(json.dumps(doc)) < 1024 * 1024, f"{name}: a ConfigMap holds at most 1 MiB"
    # all rule files together are what Prometheus would load: check them as one set
    groups = [g for doc in rendered_rules.values() for g in doc["spec"]["groups"]]
    if groups:
        promtool_check(groups, tmp_path)


def test_summary(chart: Any) -> None:
    """Prints the numbers the README quotes (run with -s to see them)."""
    total = sum(validate_all(render(chart, values)) for values in VARIANTS.values())
    assert total > 0
    slowest = max(RENDER_SECONDS.values()) * 1000
    print(f"{len(VARIANTS)} variants, {total} manifest validations, slowest render {slowest:.1f} ms")


def test_packaged_chart_holds_the_files_not_the_links(chart: Any, chart_dir: Path, tmp_path: Path) -> None:
    archive = helm.package(chart_dir, destination=tmp_path)
    packaged = helm.Chart.load(archive)
    try:
        names = {f["name"] for f in packaged.files}
        for name, text in repo_rule_files().items():
            assert f"alerts/{name}" in names
            got = next(f["data"] for f in packaged.files if f["name"] == f"alerts/{name}")
            assert got == text
        assert {n for n in names if n.startswith("dashboards/")} == {
            f"dashboards/{name}" for name in repo_dashboard_files()
        }
        assert (
            packaged.render({}, name=RELEASE, namespace=NAMESPACE).keys()
            == chart.render({}, name=RELEASE, namespace=NAMESPACE).keys()
        )
    finally:
        packaged.close()
