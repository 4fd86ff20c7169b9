"""Tables of the rules, thresholds, scenarios and settings, made from their declarations."""

from __future__ import annotations

import dataclasses
import io
import re
import tokenize
from pathlib import Path

from exporter.diagnosis import thresholds as thresholds_module
from exporter.diagnosis.fmt import value_text
from exporter.diagnosis.rules import RULES
from exporter.diagnosis.thresholds import DEFAULT, GIB, Thresholds
from exporter.sim.scenario import builtin_names, load_builtin

SCOPES = {"gpu": "GPU", "engine": "engine", "gpu_engine": "GPU x engine"}
_NAME = re.compile(r"\b([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b")


def _value(name: str, th: Thresholds = DEFAULT) -> str:
    v = getattr(th, name)
    if isinstance(v, tuple):
        return ", ".join(str(x) for x in v)
    if name.endswith("_bytes"):
        return value_text(v, "bytes") if v % GIB else f"{v // GIB} GiB"
    if name.endswith("_s"):
        return value_text(v, "seconds")
    if name.endswith("_ratio"):
        return value_text(v, "ratio")
    if name.endswith("_per_second"):
        return f"{v:g}/s" if v < 1e6 else value_text(v, "bytes_per_second")
    return f"{v:g}"


def _with_values(text: str) -> str:
    fields = {f.name for f in dataclasses.fields(Thresholds)}

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        return f"`{name}` ({_value(name)})" if name in fields else m.group(0)

    return _NAME.sub(sub, text)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rule_table() -> str:
    rows = [
        "| id | severity | per | condition (current thresholds) | hold / clear | advice |",
        "|---|---|---|---|---|---|",
    ]
    for r in RULES:
        hold, clear = value_text(r.hold(DEFAULT), "seconds"), value_text(r.clear(DEFAULT), "seconds")
        hold = "none" if r.hold(DEFAULT) == 0 else hold
        if r.window(DEFAULT):  # a rate's or a quantile's window, added to the hold
            hold += f" + {value_text(r.window(DEFAULT), 'seconds')} window"
        clear = "none" if r.clear(DEFAULT) == 0 else clear
        rows.append(
            f"| `{r.id}` | {r.severity} | {SCOPES[r.scope]} | {_cell(_with_values(r.condition))} | "
            f"{hold} / {clear} | {_cell(r.advice)} |"
        )
    return "\n".join(rows)


def threshold_comments() -> dict[str, str]:
    """Each Thresholds field's reason, from the comments in thresholds.py.

    A comment block explains the fields below it up to the next blank line or comment;
    fields after the first in such a group get "〃". A comment at the end of a field's
    line is that field's own.
    """
    out: dict[str, str] = {}
    group: str | None = None
    block: list[str] = []
    in_class = False
    for line in Path(thresholds_module.__file__).read_text().splitlines():
        if line.startswith("class Thresholds"):
            in_class = True
            continue
        if not in_class:
            continue
        stripped = line.strip()
        if not stripped:
            group, block = None, []
        elif stripped.startswith("#"):
            text = stripped.lstrip("#").strip()
            if text.startswith("----"):
                group, block = None, []
            else:
                block.append(text)
                group = None
        elif line.startswith("    ") and ":" in stripped and not stripped.startswith(("def ", "@")):
            name = stripped.split(":", 1)[0]
            own = _trailing_comment(stripped)
            if block:
                group = " ".join(block)
                out[name] = " ".join(filter(None, [group, own]))
                block = []
            elif own:
                out[name] = own
            elif group is not None:
                out[name] = "〃"
    return out


def _trailing_comment(line: str) -> str:
    tokens = list(tokenize.generate_tokens(io.StringIO(line + "\n").readline))
    return next((t.string.lstrip("#").strip() for t in tokens if t.type == tokenize.COMMENT), "")


def threshold_table() -> str:
    reasons = threshold_comments()
    rows = ["| threshold | default | why |", "|---|---|---|"]
    for f in dataclasses.fields(Thresholds):
        rows.append(f"| `{f.name}` | {_cell(_value(f.name))} | {_cell(reasons.get(f.name, ''))} |")
    return "\n".join(rows)


def scenario_table() -> str:
    rows = [
        "| scenario | GPUs | engines | length | findings it must produce |",
        "|---|---|---|---|---|",
    ]
    for name in builtin_names():
        s = load_builtin(name)
        models = sorted({e.model.rsplit("/", 1)[-1] for e in s.engines})
        engines = f"{len(s.engines)} ({', '.join(models)})"
        findings = ", ".join(f"`{f}`" for f in s.expect_findings) or "none"
        mig = " (MIG)" if s.mig else ""
        rows.append(
            f"| [`{name}`](../exporter/sim/scenarios/{name}.yaml) | {s.gpu_count}x {s.gpu_model.name}{mig} | "
            f"{engines} | {value_text(s.duration, 'seconds')} | {findings} |"
        )
    return "\n".join(rows)


def matrix() -> str:
    """Rule -> the scenarios that must produce it."""
    names = builtin_names()
    scenarios = {n: set(load_builtin(n).expect_findings) for n in names}
    rows = ["| rule | layer | scenarios that must produce it |", "|---|---|---|"]
    for r in RULES:
        which = ", ".join(f"`{n}`" for n in names if r.id in scenarios[n]) or "(unit tests only)"
        rows.append(f"| `{r.id}` | {r.layer} | {which} |")
    return "\n".join(rows)


def settings_table() -> str:
    """Every setting of exporter.config.Settings: its flag, default, valid values and meaning."""
    from exporter.config import Settings, flag_of, range_text

    rows = ["| setting | flag | default | valid | meaning |", "|---|---|---|---|---|"]
    for name, f in Settings.model_fields.items():
        flag = flag_of(name)
        if f.annotation is bool:
            flag = f"{flag} / --no-{name.replace('_', '-')}"
        default = (
            "—"
            if f.default in (None, ())
            else f"`{str(f.default).lower() if isinstance(f.default, bool) else f.default}`"
        )
        valid = _cell(range_text(name))
        rows.append(f"| `{name}` | `{flag}` | {default} | {valid} | {_cell(str(f.description))} |")
    return "\n".join(rows)
