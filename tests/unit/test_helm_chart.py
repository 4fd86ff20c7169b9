"""The Helm chart, rendered with the Helm v4 engine (helm-python-sdk) and checked object by object.

Core kinds are validated with kubernetes-validate --strict for Kubernetes 1.29 and 1.32.
ServiceMonitor, PodMonitor and PrometheusRule are CRDs that kubernetes-validate has no
schema for: they are checked against the subset of the monitoring.coreos.com/v1 schemas
written below (the fields the chart emits, unknown fields rejected). PrometheusRule groups
go through `promtool check rules`, dashboard ConfigMaps must hold valid JSON. Rules
rendered with other alert values are compared with the files field by field and run
through `promtool test rules`.
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

pytestmark = pytest.mark.slow  # plays scenarios or starts servers: `make unit` leaves it out

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
        "tolerateAllNoSchedule": False,
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
    "kube-prometheus-stack": {
        "prometheus": {"release": "kps"},
        "serviceMonitor": {
            "labels": {"team": "inference"},
            "jobLabel": "app.kubernetes.io/name",
            "targetLabels": ["app.kubernetes.io/instance"],
            "sampleLimit": 20000,
        },
        "prometheusRule": {"labels": {"prometheus": "gpu"}},
    },
    "podmonitor-kube-prometheus-stack": {
        "prometheus": {"release": "kps"},
        "serviceMonitor": {"enabled": False},
        "podMonitor": {
            "enabled": True,
            "labels": {"release": "kps-gpu"},
            "jobLabel": "app.kubernetes.io/name",
            "targetLabels": ["app.kubernetes.io/instance", "app.kubernetes.io/version"],
            "sampleLimit": 20000,
        },
    },
    "alert-values": {
        "prometheusRule": {
            "job": "monitoring/gpu-exporter",
            "runbookBaseUrl": "https://git.example.com/ops/llm-gpu-exporter/blob/v0.1.0/docs/runbooks.md",
            "thresholds": {"smActiveRatio": 0.8, "engineErrorRatio": 0.005, "nvLinkErrors": 25},
            "ttftSlo": {"seconds": 0.5, "objective": 0.99, "bucketBelow": "0.25", "bucketAbove": "0.5"},
        },
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
                "jobLabel": {"type": "string", "minLength": 1},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "sampleLimit": {"type": "integer", "minimum": 1},
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
                # a PodMonitor has no targetLabels: pod labels go to podTargetLabels
                "jobLabel": {"type": "string", "minLength": 1},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "sampleLimit": {"type": "integer", "minimum": 1},
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
    # without it a MIG parent refuses memory info and processes to the container
    assert env["NVIDIA_MIG_MONITOR_DEVICES"]["value"] == "all"
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


def test_process_owners_need_the_pod_list_and_host_pids(chart: Any) -> None:
    values = {"attribution": {"enabled": True, "processes": True, "podLabels": "team|app"}}
    docs = render(chart, values)
    pod = daemonset_pod(docs)
    assert pod["hostPID"] is True and pod["automountServiceAccountToken"] is True
    assert one(docs, "ClusterRole")["rules"][0]["verbs"] == ["list"]
    config = config_of(docs)
    assert (config["process_owners"], config["pod_labels"]) == (True, "team|app")
    for bad, why in (
        ({"attribution": {"processes": True}}, "attribution.processes needs attribution.enabled"),
        ({"attribution": {"enabled": True, "podLabels": "x"}}, "attribution.podLabels needs"),
    ):
        with pytest.raises(Exception, match=why):
            render(chart, bad)


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
    assert pod["tolerations"] == VARIANTS["custom-selectors"]["tolerations"]
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


def test_notes_tell_what_is_left_to_set(chart: Any) -> None:
    def notes(values: dict[str, Any]) -> str:
        out = chart.render(values, name=RELEASE, namespace=NAMESPACE)
        return str(next(v for k, v in out.items() if k.endswith("NOTES.txt")))

    default = notes({})
    assert "set prometheus.release=<its release name>" in default
    assert "set prometheusRule.runbookBaseUrl" in default
    assert "searchNamespace" in default
    configured = notes(VARIANTS["kube-prometheus-stack"] | VARIANTS["alert-values"])
    assert "release=kps" in configured and "prometheus.release=<" not in configured
    assert "runbookBaseUrl" not in configured


# --- kube-prometheus-stack selectors and monitor settings ----------------------------------


def test_release_label_reaches_the_monitor_and_the_rules_only(chart: Any) -> None:
    docs = render(chart, VARIANTS["kube-prometheus-stack"])
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["metadata"]["labels"]["team"] == "inference"
    rules = by_kind(docs, "PrometheusRule")
    assert rules
    for rule in rules:
        assert rule["metadata"]["labels"]["release"] == "kps"
        assert rule["metadata"]["labels"]["prometheus"] == "gpu"
    # the Service, DaemonSet and dashboards are selected by other means
    for doc in docs:
        if doc["kind"] not in CRD_KINDS:
            assert "release" not in doc["metadata"].get("labels", {}), doc["kind"]
    default = render(chart, {})
    for doc in by_kind(default, "ServiceMonitor") + by_kind(default, "PrometheusRule"):
        assert "release" not in doc["metadata"]["labels"]


def test_podmonitor_gets_the_release_label_and_its_own_labels_win(chart: Any) -> None:
    docs = render(chart, VARIANTS["podmonitor-kube-prometheus-stack"])
    monitor = one(docs, "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps-gpu"
    for rule in by_kind(docs, "PrometheusRule"):
        assert rule["metadata"]["labels"]["release"] == "kps"


def test_monitor_job_label_target_labels_and_sample_limit(chart: Any) -> None:
    docs = render(chart, VARIANTS["kube-prometheus-stack"])
    spec = one(docs, "ServiceMonitor")["spec"]
    service_labels = one(docs, "Service")["metadata"]["labels"]
    assert spec["jobLabel"] == "app.kubernetes.io/name"
    assert spec["targetLabels"] == ["app.kubernetes.io/instance"]
    assert spec["sampleLimit"] == 20000
    # the labels named exist on the Service, or Prometheus would find nothing to copy
    assert {spec["jobLabel"], *spec["targetLabels"]} <= set(service_labels)
    # a PodMonitor copies pod labels: podTargetLabels, which a ServiceMonitor calls targetLabels
    docs = render(chart, VARIANTS["podmonitor-kube-prometheus-stack"])
    spec = one(docs, "PodMonitor")["spec"]
    pod_labels = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert spec["podTargetLabels"] == ["app.kubernetes.io/instance", "app.kubernetes.io/version"]
    assert "targetLabels" not in spec
    assert spec["jobLabel"] == "app.kubernetes.io/name" and spec["sampleLimit"] == 20000
    assert {spec["jobLabel"], *spec["podTargetLabels"]} <= set(pod_labels)
    # unset, the fields are left out (sampleLimit 0 means no limit)
    spec = one(render(chart, {}), "ServiceMonitor")["spec"]
    assert not {"jobLabel", "targetLabels", "sampleLimit"} & set(spec)


# --- tolerations ---------------------------------------------------------------------------

GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
ANY_NO_SCHEDULE = {"operator": "Exists", "effect": "NoSchedule"}


def test_every_noschedule_taint_is_tolerated_by_default(chart: Any) -> None:
    pod = daemonset_pod(render(chart, {}))
    assert pod["tolerations"] == [GPU_TAINT, ANY_NO_SCHEDULE]
    # NoExecute taints evict running pods: those stay the operator's to list
    assert all(t.get("effect") != "NoExecute" for t in pod["tolerations"])
    assert daemonset_pod(render(chart, {"tolerateAllNoSchedule": False}))["tolerations"] == [GPU_TAINT]
    nothing = daemonset_pod(render(chart, {"tolerateAllNoSchedule": False, "tolerations": []}))
    assert "tolerations" not in nothing
    only_catch_all = daemonset_pod(render(chart, {"tolerations": []}))
    assert only_catch_all["tolerations"] == [ANY_NO_SCHEDULE]
    # listed by the operator already: not twice
    listed = daemonset_pod(render(chart, {"tolerations": [ANY_NO_SCHEDULE, GPU_TAINT]}))
    assert listed["tolerations"] == [ANY_NO_SCHEDULE, GPU_TAINT]
    custom = {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoExecute"}
    both = daemonset_pod(render(chart, {"tolerations": [custom]}))
    assert both["tolerations"] == [custom, ANY_NO_SCHEDULE]


# --- one source for alerts and dashboards --------------------------------------------------


def repo_rule_files() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((ROOT / "alerts").glob("*.rules.yml"))}


def repo_dashboard_files() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((ROOT / "dashboards").glob("*.json"))}


def without_runbook_urls(spec: dict[str, Any]) -> dict[str, Any]:
    for group in spec["groups"]:
        for rule in group["rules"]:
            rule.get("annotations", {}).pop("runbook_url", None)
    return spec


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
    # with the default values the chart writes back every literal it owns; runbook_url
    # is left out while prometheusRule.runbookBaseUrl is empty
    for name, doc in rendered_rules.items():
        assert doc["spec"] == without_runbook_urls(yaml.safe_load(rules[name])), name
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


# --- alert values: the rule files rendered with other thresholds, SLO, job and runbooks ----

FILE_RUNBOOK_BASE = "https://github.com/llm-gpu-exporter/llm-gpu-exporter/blob/main/docs/runbooks.md"
RUNBOOK_BASE = "https://git.example.com/ops/llm-gpu-exporter/blob/v0.1.0/docs/runbooks.md"
TTFT_RECORDS = [f"target_model:llmgpu_engine_ttft_over_slo:ratio_rate{w}" for w in ("5m", "30m", "1h", "6h")]
BURN_ALERTS = ["LlmGpuTtftSloBurnFast", "LlmGpuTtftSloBurnSlow"]


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def rule_fields(chart: Any, values: dict[str, Any]) -> dict[tuple[str, str], str]:
    """(rule name, field) -> text for every rule of the rendered PrometheusRules: expr, for,
    each label and each annotation."""
    fields: dict[tuple[str, str], str] = {}
    for doc in by_kind(render(chart, values), "PrometheusRule"):
        for group in doc["spec"]["groups"]:
            for rule in group["rules"]:
                name = rule.get("alert") or rule["record"]
                fields[(name, "expr")] = rule["expr"]
                fields[(name, "for")] = rule.get("for", "")
                for key, text in rule.get("labels", {}).items():
                    fields[(name, f"labels.{key}")] = text
                for key, text in rule.get("annotations", {}).items():
                    fields[(name, key)] = text
    return fields


def rule_changes(
    chart: Any, values: dict[str, Any]
) -> tuple[dict[tuple[str, str], str], dict[tuple[str, str], str]]:
    """The fields that differ from the files' rules, before and after (runbook base held equal)."""
    same_base = {"prometheusRule": {"runbookBaseUrl": FILE_RUNBOOK_BASE}}
    before = rule_fields(chart, same_base)
    after = rule_fields(chart, deep_merge(same_base, values))
    assert before.keys() == after.keys()
    changed = [key for key in before if before[key] != after[key]]
    return {k: before[k] for k in changed}, {k: after[k] for k in changed}


def test_with_runbook_base_set_to_the_files_the_rules_are_the_files(chart: Any) -> None:
    """The defaults of values.yaml are the literals of alerts/*.rules.yml."""
    docs = render(chart, {"prometheusRule": {"runbookBaseUrl": FILE_RUNBOOK_BASE}})
    rules = repo_rule_files()
    for doc in by_kind(docs, "PrometheusRule"):
        name = Path(doc["metadata"]["annotations"]["llm-gpu-exporter.io/source"]).name
        assert doc["spec"] == yaml.safe_load(rules[name]), name


# value, the rule it moves, the literal in the file, the literal rendered
THRESHOLDS = [
    ("smActiveRatio", 0.8, "LlmGpuSmSaturated", "ratio > 0.95", "ratio > 0.8"),
    ("clockThrottledRatio", 0.25, "LlmGpuClocksThrottled", "[5m]) > 0.5", "[5m]) > 0.25"),
    ("nvLinkErrors", 25, "LlmGpuNvLinkErrors", "[5m])) > 10", "[5m])) > 25"),
    ("oomRiskRatio", 0.75, "LlmGpuOomRiskHigh", ">= 0.6", ">= 0.75"),
    ("memoryFreeRatio", 0.05, "LlmGpuMemoryExhaustion", "< 0.1", "< 0.05"),
    ("kvCacheUsageRatio", 0.9, "LlmGpuKvCacheSaturated", "ratio > 0.95", "ratio > 0.9"),
    ("engineErrorRatio", 0.005, "LlmGpuEngineErrorRatioHigh", "> 0.001", "> 0.005"),
    ("collectorSampleAgeSeconds", 120, "LlmGpuExporterStale", "seconds > 60", "seconds > 120"),
]


@pytest.mark.parametrize(("key", "value", "alert", "old", "new"), THRESHOLDS, ids=[t[0] for t in THRESHOLDS])
def test_a_threshold_changes_exactly_its_alert(
    chart: Any, key: str, value: float, alert: str, old: str, new: str
) -> None:
    before, after = rule_changes(chart, {"prometheusRule": {"thresholds": {key: value}}})
    expected = {(alert, "expr")} | ({(alert, "summary")} if key == "engineErrorRatio" else set())
    assert set(after) == expected
    assert before[(alert, "expr")].count(old) == 1
    assert after[(alert, "expr")] == before[(alert, "expr")].replace(old, new)
    if key == "engineErrorRatio":
        assert after[(alert, "summary")] == "More than 0.5 % of the engine's requests fail."


def test_the_ttft_target_changes_the_recording_rules_and_the_burn_texts(chart: Any) -> None:
    before, after = rule_changes(
        chart, {"prometheusRule": {"ttftSlo": {"seconds": 0.5, "bucketBelow": "0.25", "bucketAbove": "0.5"}}}
    )
    assert set(after) == {(r, "expr") for r in TTFT_RECORDS} | {
        (a, f) for a in BURN_ALERTS for f in ("summary", "description")
    }
    for record in TTFT_RECORDS:
        expr = after[(record, "expr")]
        assert expr == (
            before[(record, "expr")]
            .replace('{le="0.25"}', '{le="0.5"}')
            .replace('{le="0.1"}', '{le="0.25"}')
            .replace("(250 - 200) / (250 - 100)", "(500 - 500) / (500 - 250)")
            .replace("(200 - 100) / (250 - 100)", "(500 - 250) / (500 - 250)")
        )
    for alert in BURN_ALERTS:
        assert "the 500 ms SLO" in after[(alert, "summary")]
        assert after[(alert, "description")] == before[(alert, "description")].replace(
            "later than 200 ms", "later than 500 ms"
        )


def test_the_objective_changes_the_burn_thresholds_and_texts(chart: Any) -> None:
    before, after = rule_changes(chart, {"prometheusRule": {"ttftSlo": {"objective": 0.99}}})
    assert set(after) == {(a, f) for a in BURN_ALERTS for f in ("expr", "description")}
    assert after[("LlmGpuTtftSloBurnFast", "expr")] == before[("LlmGpuTtftSloBurnFast", "expr")].replace(
        "14.4 * 0.05", "14.4 * 0.01"
    )
    assert after[("LlmGpuTtftSloBurnSlow", "expr")] == before[("LlmGpuTtftSloBurnSlow", "expr")].replace(
        "6 * 0.05", "6 * 0.01"
    )
    for alert in BURN_ALERTS:
        assert "the 1 % the objective allows" in after[(alert, "description")]


def test_the_job_changes_the_exporter_down_and_absent_alerts(chart: Any) -> None:
    _, after = rule_changes(chart, {"prometheusRule": {"job": 'gpu\\.exporter$|"odd"'}})
    assert set(after) == {
        ("LlmGpuExporterDown", "expr"),
        ("LlmGpuExporterAbsent", "expr"),
        ("LlmGpuExporterAbsent", "description"),
    }
    # written as a PromQL string: backslash and quote escaped, a $ kept as it is
    selector = 'up{job=~"gpu\\\\.exporter$|\\"odd\\""}'
    assert after[("LlmGpuExporterDown", "expr")] == selector + " == 0"
    assert after[("LlmGpuExporterAbsent", "expr")] == f"absent({selector})"
    assert selector in after[("LlmGpuExporterAbsent", "description")]


def test_the_runbook_base_changes_every_runbook_url_and_nothing_else(chart: Any) -> None:
    _, after = rule_changes(chart, {"prometheusRule": {"runbookBaseUrl": RUNBOOK_BASE}})
    alerts = {name for (name, field) in rule_fields(chart, {}) if field == "labels.severity"}
    assert set(after) == {(name, "runbook_url") for name in alerts}
    for (name, _), url in after.items():
        assert url == f"{RUNBOOK_BASE}#{name.lower()}"
    # empty (the default): no alert links to the placeholder repository of the files
    assert not [key for key in rule_fields(chart, {}) if key[1] == "runbook_url"]


def test_a_ttft_target_outside_its_buckets_is_refused(chart: Any) -> None:
    for slo in ({"seconds": 0.3}, {"seconds": 0.1}, {"bucketBelow": "0.25", "bucketAbove": "0.1"}):
        with pytest.raises(helm.HelmRenderError, match=r"bucketBelow .* < seconds .* <= bucketAbove"):
            chart.render({"prometheusRule": {"ttftSlo": slo}}, name=RELEASE, namespace=NAMESPACE)


def chart_with_rules(tmp_path: Path, edit: Any) -> Any:
    """A copy of the chart whose alerts/ is a real directory, with `edit` applied to the
    alert rule file's text."""
    copy = tmp_path / CHART.name
    shutil.copytree(CHART, copy, symlinks=False)
    path = copy / "alerts" / "llmgpu-alerts.rules.yml"
    path.write_text(edit(path.read_text()))
    return helm.Chart.load(copy)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda text: text.replace(
                "llmgpu_gpu_sm_active_ratio > 0.95", "llmgpu_gpu_sm_active_ratio >= 0.95"
            ),
            r"llmgpu-alerts.rules.yml: the expr of LlmGpuSmSaturated no longer contains "
            r'"llmgpu_gpu_sm_active_ratio > \{smActiveRatio\}"',
        ),
        (
            lambda text: text.replace("burns the 200 ms SLO's", "burns the SLO's"),
            r"the summary of LlmGpuTtftSloBurnFast no longer contains",
        ),
        (
            lambda text: text.replace("alert: LlmGpuExporterAbsent", "alert: LlmGpuExporterGone"),
            r"has no rule LlmGpuExporterAbsent, which templates/_rules.tpl edits",
        ),
        (lambda text: text.replace("groups:", "groups: ["), r"llmgpu-alerts.rules.yml: .*yaml"),
    ],
    ids=["literal-rewritten", "summary-rewritten", "rule-renamed", "not-yaml"],
)
def test_a_rule_file_out_of_step_with_the_chart_fails_the_render(
    tmp_path: Path, edit: Any, message: str
) -> None:
    changed = chart_with_rules(tmp_path, edit)
    try:
        with pytest.raises(helm.HelmRenderError, match=message):
            changed.render({}, name=RELEASE, namespace=NAMESPACE)
    finally:
        changed.close()


def test_rules_rendered_with_other_values_behave_so_under_promtool(chart: Any, tmp_path: Path) -> None:
    """promtool runs the rules of the alert-values variant on inputs that only its values
    explain: an SM threshold of 0.8, a 500 ms target on a bucket bound with a 99 %
    objective, the job monitoring/gpu-exporter."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    groups = [
        g
        for doc in by_kind(render(chart, VARIANTS["alert-values"]), "PrometheusRule")
        for g in doc["spec"]["groups"]
    ]
    rules_path = tmp_path / "rendered.rules.yml"
    rules_path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    node = {"job": "monitoring/gpu-exporter", "instance": "gpu-node-1:9445"}
    engine = node | {"engine": "vllm", "target": "127.0.0.1:8000", "model": "llama-70b"}

    def selector(name: str, labels: dict[str, str]) -> str:
        return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"

    def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
        return {"series": selector(name, labels), "values": values}

    def alert(labels: dict[str, str], summary: str, description: str, name: str) -> dict[str, Any]:
        return {
            "exp_labels": labels,
            "exp_annotations": {
                "summary": summary,
                "description": description,
                "runbook_url": f"{RUNBOOK_BASE}#{name.lower()}",
            },
        }

    ttft = "llmgpu_engine_time_to_first_token_seconds"
    tests = [
        {
            "name": "SMs 85 % busy: over 0.8, under the file's 0.95",
            "interval": "1m",
            "input_series": [
                series("llmgpu_gpu_sm_active_ratio", node | {"gpu": "0"}, "0.85x10"),
                series("llmgpu_gpu_sm_active_ratio", node | {"gpu": "1"}, "0.75x10"),
            ],
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": "LlmGpuSmSaturated", "exp_alerts": []},
                {
                    "eval_time": "4m",
                    "alertname": "LlmGpuSmSaturated",
                    "exp_alerts": [
                        alert(
                            {"severity": "warning", **node, "gpu": "0"},
                            "GPU streaming multiprocessors are saturated.",
                            "GPU 0 on gpu-node-1:9445 has had 85% of its SMs busy for more than 3 minutes; "
                            "requests now queue instead of running.",
                            "LlmGpuSmSaturated",
                        )
                    ],
                },
            ],
        },
        {
            # 40 % under 0.25 s, 75 % under 0.5 s: 25 % over the 500 ms target, exactly (a
            # bucket bound), which burns a 1 % budget 25 times over. The files' rules read
            # 37 % over 200 ms against a 72 % line and stay silent.
            "name": "25 % of first tokens over 500 ms",
            "interval": "1m",
            "input_series": [
                series(f"{ttft}_bucket", engine | {"le": "0.1"}, "0+10x30"),
                series(f"{ttft}_bucket", engine | {"le": "0.25"}, "0+40x30"),
                series(f"{ttft}_bucket", engine | {"le": "0.5"}, "0+75x30"),
                series(f"{ttft}_count", engine, "0+100x30"),
            ],
            "promql_expr_test": [
                {
                    "expr": TTFT_RECORDS[0],
                    "eval_time": "10m",
                    "exp_samples": [{"labels": selector(TTFT_RECORDS[0], engine), "value": 0.25}],
                }
            ],
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "LlmGpuTtftSloBurnFast", "exp_alerts": []},
                {
                    "eval_time": "5m",
                    "alertname": "LlmGpuTtftSloBurnFast",
                    "exp_alerts": [
                        alert(
                            {"severity": "critical", **engine},
                            "Time to first token burns the 500 ms SLO's error budget fast.",
                            "llama-70b on gpu-node-1:9445 (target 127.0.0.1:8000) served 25% of "
                            "requests in the last 5 minutes with a first token later than 500 ms, "
                            "over 14 times the 1 % the objective allows.",
                            "LlmGpuTtftSloBurnFast",
                        )
                    ],
                },
            ],
        },
        {
            "name": "The exporter job is monitoring/gpu-exporter",
            "interval": "1m",
            "input_series": [
                series("up", {"job": "monitoring/gpu-exporter", "instance": "10.0.0.7:9445"}, "0x10"),
                # the files' default job: not this release's any more
                series("up", {"job": "llm-gpu-exporter", "instance": "10.0.0.8:9445"}, "0x10"),
            ],
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "LlmGpuExporterDown", "exp_alerts": []},
                {
                    "eval_time": "3m",
                    "alertname": "LlmGpuExporterDown",
                    "exp_alerts": [
                        alert(
                            {
                                "severity": "critical",
                                "job": "monitoring/gpu-exporter",
                                "instance": "10.0.0.7:9445",
                            },
                            "Prometheus cannot scrape the GPU exporter.",
                            "The exporter at 10.0.0.7:9445 (job monitoring/gpu-exporter) has failed "
                            "its scrapes for more than 2 minutes; the node's GPUs and engines are "
                            "unwatched.",
                            "LlmGpuExporterDown",
                        )
                    ],
                },
                {"eval_time": "12m", "alertname": "LlmGpuExporterAbsent", "exp_alerts": []},
            ],
        },
        {
            "name": "Only the files' default job is scraped: this release's job is absent",
            "interval": "1m",
            "input_series": [series("up", {"job": "llm-gpu-exporter", "instance": "10.0.0.8:9445"}, "1x15")],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "LlmGpuExporterAbsent", "exp_alerts": []},
                {
                    "eval_time": "11m",
                    "alertname": "LlmGpuExporterAbsent",
                    "exp_alerts": [
                        alert(
                            {"severity": "critical"},
                            "Prometheus has no GPU exporter target at all.",
                            'Prometheus has had no series up{job=~"monitoring/gpu-exporter"} for more than '
                            "10 minutes: no exporter target is left, so no GPU or engine is watched.",
                            "LlmGpuExporterAbsent",
                        )
                    ],
                },
            ],
        },
    ]
    test_path = tmp_path / "rendered.test.yml"
    test_path.write_text(
        yaml.safe_dump(
            {"rule_files": [str(rules_path)], "evaluation_interval": "1m", "tests": tests}, sort_keys=False
        )
    )
    result = subprocess.run(
        [promtool, "test", "rules", str(test_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
