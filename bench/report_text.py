"""Markdown text for the benchmark report: a list of lines with tables, and number formats."""

from __future__ import annotations

from collections.abc import Sequence


def ms(x: float) -> str:
    if x != x:  # NaN
        return "n/a"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def kb(n: float) -> str:
    return f"{n / 1024:.0f} KiB" if n >= 10240 else f"{n / 1024:.1f} KiB"


def mb(kib: float) -> float:
    return kib * 1024 / 1e6


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


class Doc:
    """Markdown lines, with table helpers."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, *parts: str) -> None:
        self.lines.append("".join(parts))

    def para(self, *parts: str) -> None:
        self.lines.append(" ".join(parts))
        self.lines.append("")

    def table(self, head: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        self.lines.append("| " + " | ".join(head) + " |")
        self.lines.append("|" + "---|" * len(head))
        for r in rows:
            self.lines.append("| " + " | ".join(r) + " |")
        self.lines.append("")

    def text(self) -> str:
        return "\n".join(self.lines).rstrip() + "\n"
