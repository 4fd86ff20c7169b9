"""The package layering of exporter/layers.py, checked on every import statement.

Readings know nothing but how to declare metrics; collectors never see the diagnosis;
the diagnosis never sees NVML, HTTP, a collector or the simulator; only the NVML layer
and the simulator import pynvml, only the HTTP layer the web framework. A change that
crosses a line fails here and names the import.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from exporter.layers import layer_of

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "exporter"
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}


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


def allowed(module: str, name: str) -> bool:
    """May `module` import the package module or third-party name `name`?"""
    layer = layer_of(module)
    assert layer is not None, f"{module} has no entry in exporter/layers.py"
    if not within(name, "exporter"):
        return name.split(".")[0] in (*STDLIB, *layer.third_party)
    if name in ("exporter", "exporter.__version__"):
        return True
    prefixes = [f"exporter.{p}" for p in (*layer.may_import, layer.prefix)]
    # `from exporter.x import y` lists both exporter.x and exporter.x.y: one must fit
    return any(within(name, p) or within(p, name) for p in prefixes)


def violations() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        if layer_of(module) is None:
            found.append(f"{module} has no entry in exporter/layers.py")
            continue
        for name in imports(path):
            if not allowed(module, name):
                found.append(f"{module} imports {name}")
    return sorted(set(found))


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
        ("exporter.runner", "exporter.diagnosis.diagnoser", False),  # no wildcard for the runner
        ("exporter.web.server", "exporter.nvml", False),
        ("exporter.diagnosis.frame", "fastapi", False),  # the web framework only in the HTTP layer
        ("exporter.diagnosis.frame", "exporter.sim.scenario", False),
        ("exporter.app", "exporter.sim.fakenvml", False),  # the simulator hands app its environment
        ("exporter.collectors.gpu", "pynvml", False),  # pynvml only in exporter.nvml and the simulator
        ("exporter.nvml", "pynvml", True),
        ("exporter.web.routes", "fastapi", True),
    ],
)
def test_the_layer_rules_mean_what_they_say(module: str, name: str, ok: bool) -> None:
    assert allowed(module, name) is ok


def test_the_docs_table_is_the_layers_table() -> None:
    from exporter.docgen.layers import layer_table

    assert layer_table() in (ROOT / "docs/architecture.md").read_text()


def test_no_module_of_the_package_is_over_600_lines() -> None:
    long = {module_name(p): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}
