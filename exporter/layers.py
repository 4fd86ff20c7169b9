"""Who may import whom, written once.

Every module of the package falls under the most specific entry whose prefix it starts
with; it may import the package modules under the prefixes listed (and its own entry's),
and third-party distributions only where named. tests/unit/test_architecture.py checks
each import statement against this table, and the table in docs/architecture.md is
generated from it. Importing `exporter` itself (its version) is open to all.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layer:
    prefix: str  # module path under exporter/, dotted
    what: str
    may_import: tuple[str, ...] = ()  # package prefixes, dotted, without "exporter."
    third_party: tuple[str, ...] = ()  # top-level import names beyond the standard library


READINGS = ("metricdef", "gpu_readings", "allocator_readings", "engines.readings", "probe.schema")

LAYERS: tuple[Layer, ...] = (
    Layer("", "the package: its version"),
    # ---- declarations and facts: import nothing of the package
    Layer("metricdef", "metric declarations on reading fields; the sample walk"),
    Layer("gpu_specs", "the one table of GPU datasheet facts (peak bandwidth, FLOP/s, NVLinks, GPM)"),
    Layer(
        "config", "settings from flags, environment and file", (), ("pydantic", "pydantic_settings", "yaml")
    ),
    Layer(
        "nvml", "the only module that calls pynvml: error mapping, handles, versioned calls", (), ("pynvml",)
    ),
    Layer("layers", "this table"),
    # ---- readings: typed values, and the snapshot that holds them
    Layer("gpu_readings", "GPU readings", ("metricdef",)),
    Layer("engines.readings", "engine readings", ("metricdef",)),
    Layer("allocator_readings", "allocator probe readings", ("metricdef", "probe.schema")),
    Layer("snapshot", "the immutable snapshot of one cycle", ("metricdef", "gpu_readings")),
    # ---- sources
    Layer("probe", "the allocator probe: runs inside engines, writes files; stdlib only"),
    Layer("k8s", "kubelet pod resources, pods, cgroups: who runs on which GPU", (), ("httpx", "grpc")),
    Layer(
        "engines",
        "engine targets, bounded fetch, normalizing, derived rates, process trees, the engine-GPU join",
        (*READINGS, "snapshot", "k8s"),
        ("httpx", "prometheus_client", "psutil"),
    ),
    Layer(
        "dcgm",
        "a co-located dcgm-exporter: where it is, its page, staleness, self-metrics",
        ("metricdef", "engines.fetch", "k8s"),
        ("httpx", "prometheus_client"),
    ),
    Layer(
        "collectors",
        "one module per registered collector; base.py holds the contract and the registry",
        (*READINGS, "nvml", "config", "gpu_specs", "engines", "dcgm", "probe"),
        ("psutil",),
    ),
    # ---- the diagnosis: frames, rules, score; never NVML, HTTP, a collector or the simulator
    Layer(
        "diagnosis",
        "frames and their inputs, history, OOM score, blind spots, the report",
        (*READINGS, "snapshot", "gpu_specs", "dcgm.status"),
    ),
    Layer("diagnosis.rules", "one module per layer, one decorated function per rule", ("diagnosis",)),
    # ---- composing, publishing, serving
    Layer(
        "runner",
        "runs the collectors, composes and publishes snapshots",
        ("collectors.base", *READINGS, "snapshot", "web.exposition", "web.cadence"),
    ),
    Layer("web", "HTTP: exposition bytes, limits, cadence, web-config", ("snapshot", "metricdef", "config")),
    Layer(
        "web.exposition",
        "text format and OpenMetrics, made once per scraped snapshot",
        ("metricdef", "snapshot"),
    ),
    Layer("web.limits", "connection caps and timeouts of the HTTP server", (), ("uvicorn",)),
    Layer(
        "web.webconfig",
        "TLS and authentication (the exporter-toolkit web-config file)",
        ("config",),
        ("bcrypt", "yaml"),
    ),
    Layer("web.page", "the HTML diagnosis page", ("diagnosis",)),
    Layer(
        "web.routes",
        "the diagnosis' routes: the page and its JSON",
        ("diagnosis.model", "snapshot", "web.page", "web.per_snapshot"),
        ("fastapi",),
    ),
    Layer(
        "web.server",
        "the routes of /metrics, health, readiness, the snapshot JSON",
        ("runner", "snapshot", "web"),
        ("fastapi",),
    ),
    # ---- the past, from a TSDB
    Layer(
        "tsdb",
        "`diagnose --prometheus`: frames rebuilt from stored series, the same rules",
        ("diagnosis", "gpu_specs"),
        ("httpx",),
    ),
    # ---- the simulator: a fake libnvidia-ml under pynvml, engines, probes, dcgm-exporter
    Layer(
        "sim",
        "fake NVML library, scenarios, simulated engines, dcgm-exporter and kubelet",
        ("nvml", "k8s.podresources"),
        ("pynvml", "yaml", "grpc"),
    ),
    Layer(
        "sim.node",
        "a simulated node: the environment a scenario hands `app.build`",
        ("app", "config", "environment", "sim", "snapshot"),
    ),
    # ---- nvidia-smi, for checks on a real node
    Layer("smi", "nvidia-smi's outputs parsed"),
    Layer("smi_profile", "scenario data that replays an nvidia-smi recording", ("smi", "gpu_specs")),
    Layer(
        "smi_compare",
        "the exporter's readings checked against nvidia-smi's",
        ("smi", "metricdef", "gpu_readings", "snapshot"),
        ("psutil",),
    ),
    # ---- commands and assembly
    Layer(
        "catalog",
        "every metric the package declares (imports every module to find them)",
        ("metricdef", "gpu_readings", "snapshot"),
    ),
    Layer("table", "the `snapshot` command's table", ("engines.readings", "gpu_readings", "snapshot")),
    Layer(
        "app",
        "assembly of a node from settings and an environment: NVML, collectors, runner",
        (
            "collectors",
            "config",
            "diagnosis",
            "engines.attribution",
            "k8s",
            "metricdef",
            "nvml",
            "runner",
            "snapshot",
            "web.exposition",
            "catalog",
            "environment",
        ),
    ),
    Layer(
        "environment",
        "what a node hands the exporter: sysfs, clock, extra steps, closers",
        ("config", "snapshot", "sim.node"),  # the one place a scenario's node plugs in
    ),
    Layer(
        "selfcheck",
        "`selfcheck`: the exporter against nvidia-smi on a node",
        (
            "app",
            "config",
            "environment",
            "gpu_readings",
            "metricdef",
            "nvml",
            "smi",
            "smi_compare",
            "snapshot",
        ),
    ),
    Layer(
        "docgen",
        "the generated parts of the docs, from the declarations; the README's pictures",
        ("catalog", "config", "diagnosis", "layers", "sim.scenario"),
        ("httpx",),
    ),
    Layer(
        "cli",
        "the command line",
        (
            "app",
            "config",
            "diagnosis.report",
            "environment",
            "nvml",
            "selfcheck",
            "sim",
            "table",
            "tsdb",
            "web",
        ),
        ("httpx",),
    ),
)


def layer_of(module: str) -> Layer | None:
    """The most specific entry for a dotted module name under exporter (None: no entry)."""
    name = module.removeprefix("exporter").removeprefix(".")
    found = [la for la in LAYERS if name == la.prefix or name.startswith(la.prefix + ".")]
    return max(found, key=lambda la: len(la.prefix), default=None)
