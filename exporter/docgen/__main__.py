"""`python -m exporter.docgen [--check]`: regenerate, or check, every generated doc part."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from exporter.docgen import metrics, tables
from exporter.docgen.layers import layer_table

ROOT = Path(__file__).resolve().parents[2]
FILES: dict[str, Callable[[], str]] = {"docs/metrics.md": metrics.markdown}
BLOCKS: dict[str, dict[str, Callable[[], str]]] = {
    "docs/diagnosis.md": {
        "rules": tables.rule_table,
        "thresholds": tables.threshold_table,
        "scenarios": tables.scenario_table,
    },
    "docs/scenarios.md": {"scenarios": tables.scenario_table, "matrix": tables.matrix},
    "docs/architecture.md": {"layers": layer_table},
    "README.md": {"settings": tables.settings_table},
}


def _keeping_markers(body: str) -> Callable[[re.Match[str]], str]:
    return lambda m: m.group(1) + body + "\n" + m.group(2)


def update(text: str, blocks: dict[str, str]) -> str:
    for name, body in blocks.items():
        pattern = re.compile(
            rf"(<!-- BEGIN generated:{name} -->\n).*?(<!-- END generated:{name} -->)", re.DOTALL
        )
        if not pattern.search(text):
            raise ValueError(f"no generated:{name} block")
        text = pattern.sub(_keeping_markers(body), text)
    return text


def generated() -> dict[str, str]:
    """Each generated file's text as the declarations make it now, by path from the root."""
    out = {rel: make() for rel, make in FILES.items()}
    for rel, makers in BLOCKS.items():
        out[rel] = update((ROOT / rel).read_text(), {name: make() for name, make in makers.items()})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m exporter.docgen", description=__doc__)
    p.add_argument("--check", action="store_true", help="fail when a generated part is stale")
    args = p.parse_args(argv)
    stale = [rel for rel, text in generated().items() if (ROOT / rel).read_text() != text]
    if args.check:
        if stale:
            print(f"stale generated docs: {', '.join(stale)}; run make docs", file=sys.stderr)
            return 1
        return 0
    for rel, text in generated().items():
        if rel in stale:
            (ROOT / rel).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
