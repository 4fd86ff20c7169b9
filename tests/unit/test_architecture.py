"""The package layering of docs/architecture.md, checked on the import statements.

Readings know nothing but how to declare metrics; collectors never see the diagnosis;
the diagnosis never sees NVML, HTTP or a collector; only the NVML layer and the
simulator import pynvml. A change that crosses a line fails here and names the import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "exporter"

READINGS = ("exporter.metricdef", "exporter.gpu_readings", "exporter.probe.schema")
# module prefix -> what it may import from the package (prefixes); None: anything
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "exporter.metricdef": (),
    "exporter.gpu_specs": (),
    "exporter.config": (),
    "exporter.nvml": (),
    "exporter.gpu_readings": ("exporter.metricdef",),
    "exporter.allocator_readings": READINGS,
    "exporter.engines.readings": ("exporter.metricdef",),
    "exporter.snapshot": READINGS,
    "exporter.web.exposition": (*READINGS, "exporter.snapshot"),
    "exporter.diagnosis.rules": ("exporter.diagnosis",),
    # the generator of the docs' tables also tabulates the settings for the README
    "exporter.diagnosis.docs": ("exporter.diagnosis", "exporter.sim.scenario", "exporter.config"),
    # the HTTP routes of the diagnosis serve bytes made once per snapshot
    "exporter.web.routes": (
        "exporter.diagnosis",
        "exporter.snapshot",
        "exporter.web.per_snapshot",
        "exporter.web.page",
    ),
    "exporter.web.page": ("exporter.diagnosis",),
    "exporter.diagnosis": (
        "exporter.diagnosis",
        *READINGS,
        "exporter.allocator_readings",
        "exporter.engines.readings",
        "exporter.gpu_specs",
        "exporter.snapshot",
        "exporter.sim.scenario",  # docs.py tabulates the shipped scenarios
        "exporter.dcgm.status",  # the coverage report names what the dcgm-exporter lacks
    ),
    "exporter.dcgm": (
        "exporter.dcgm",
        *READINGS,
        "exporter.engines.fetch",  # the same bounded fetch as engine targets
        "exporter.k8s",
    ),
    "exporter.engines": (
        "exporter.engines",
        *READINGS,
        "exporter.snapshot",
        "exporter.k8s",
    ),
    "exporter.collectors": (
        "exporter.collectors",
        "exporter.nvml",
        *READINGS,
        "exporter.allocator_readings",
        "exporter.gpu_specs",
        "exporter.config",
        "exporter.engines",
        "exporter.probe",
        "exporter.dcgm",
    ),
    "exporter.runner": (
        "exporter",
        "exporter.collectors.base",
        *READINGS,
        "exporter.snapshot",
        "exporter.web.exposition",
    ),
    "exporter.web.server": (
        "exporter",
        "exporter.runner",
        "exporter.web.exposition",
        "exporter.snapshot",
        "exporter.web.routes",
        "exporter.diagnosis.model",
        "exporter.web.webconfig",
        "exporter.config",
    ),
    # the fake library answers the field ids the NVML layer names (nvml.h constants)
    "exporter.sim": ("exporter.sim", "exporter.nvml"),
    # the diagnosis of a past hour: the same frames and rules, fed from a TSDB, never NVML
    "exporter.tsdb": ("exporter.tsdb", "exporter.diagnosis", "exporter.gpu_specs"),
    # the HTTP server's limits know nothing of what it serves
    "exporter.web.limits": (),
    "exporter.web.per_snapshot": ("exporter.snapshot",),
    # a recording turned into scenario data: plain data, so it never needs the simulator
    "exporter.smi_profile": ("exporter.smi", "exporter.gpu_specs"),
}
PYNVML_ALLOWED = ("exporter.nvml", "exporter.sim")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[str]:
    """Absolute module names a file imports (the names imported from a package too)."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
            out.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def rule_for(module: str) -> tuple[str, ...] | None:
    """The most specific layering rule for a module; None when it may import anything."""
    best = max((p for p in MAY_IMPORT if within(module, p)), key=len, default=None)
    return None if best is None else MAY_IMPORT[best]


def violations() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        allowed = rule_for(module)
        for name in imports(path):
            if within(name, "pynvml") and not any(within(module, p) for p in PYNVML_ALLOWED):
                found.append(f"{module} imports pynvml: only exporter.nvml and the simulator may")
            if allowed is None or not within(name, "exporter") or name == "exporter":
                continue
            # `from exporter.x import y` lists both exporter.x and exporter.x.y: one must fit
            if not any(within(name, p) or within(p, name) for p in (*allowed, module)):
                found.append(f"{module} imports {name}")
    return found


def test_the_package_keeps_its_layers() -> None:
    assert violations() == []


@pytest.mark.parametrize(
    ("module", "name", "ok"),
    [
        ("exporter.diagnosis.rules.memory", "exporter.nvml", False),
        ("exporter.diagnosis.rules.memory", "exporter.diagnosis.frame", True),
        ("exporter.collectors.gpm", "exporter.diagnosis.model", False),
        ("exporter.gpu_readings", "exporter.snapshot", False),
        ("exporter.engines.scraper", "exporter.collectors.base", False),
    ],
)
def test_the_layer_rules_mean_what_they_say(module: str, name: str, ok: bool) -> None:
    allowed = rule_for(module)
    assert allowed is not None
    assert any(within(name, p) or within(p, name) for p in (*allowed, module)) is ok


def test_no_module_of_the_package_is_over_600_lines() -> None:
    long = {module_name(p): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}
