"""docs/architecture.md's table of packages and what each may import, from exporter/layers.py."""

from __future__ import annotations

from exporter.layers import LAYERS


def _names(items: tuple[str, ...]) -> str:
    return ", ".join(f"`{i}`" for i in items) or "nothing"


def layer_table() -> str:
    rows = [
        "| module | what it is | may import from the package | third-party |",
        "|---|---|---|---|",
    ]
    for la in LAYERS:
        rows.append(
            f"| `{la.prefix}` | {la.what} | {_names(la.may_import)} | {', '.join(la.third_party) or '—'} |"
        )
    return "\n".join(rows)
