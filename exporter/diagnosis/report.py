"""The diagnosis as a terminal report, from the same JSON that /api/v1/diagnosis serves.

`llm-gpu-exporter diagnose --url ...` fetches that JSON, `diagnose --simulate ...` builds
it from a scenario played to its end; both print `render_text(json)` and exit with
`exit_code(json)`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from exporter.diagnosis.fmt import duration, simulation_line, value_text
from exporter.diagnosis.frame import short_target

WIDTH = 100
SEVERITY_MARK = {"critical": "CRIT", "warning": "WARN", "info": "INFO"}
ANSI = {"critical": "\033[1;31m", "warning": "\033[1;33m", "info": "\033[36m", "ok": "\033[1;32m"}
RESET = "\033[0m"


def exit_code(diagnosis_json: Mapping[str, Any]) -> int:
    """0 when no finding is active, 1 when at least one is."""
    return 1 if diagnosis_json.get("findings") else 0


def render_text(diagnosis_json: Mapping[str, Any], *, color: bool = False) -> str:
    d = diagnosis_json
    out: list[str] = []

    def paint(text: str, severity: str) -> str:
        return f"{ANSI.get(severity, '')}{text}{RESET}" if color and severity in ANSI else text

    summary = d.get("summary", {})
    status = str(d.get("status", "ok"))
    when = _when(d.get("taken_at"))
    sim = " (simulated)" if d.get("simulated") else ""
    played = d.get("simulation")
    if isinstance(played, Mapping):  # the scenario's clock, not a wall-clock time it lacks
        when = simulation_line(played)
    out.append(
        f"Node diagnosis{sim} at {when}: {paint(status.upper(), status)} - "
        f"{summary.get('gpus_up', 0)}/{summary.get('gpus', 0)} GPUs up, "
        f"{summary.get('engines_up', 0)}/{summary.get('engines', 0)} engines up, "
        f"{summary.get('active_findings', 0)} active finding(s)"
    )
    out.append("=" * WIDTH)

    findings: Sequence[Mapping[str, Any]] = d.get("findings", [])
    if not findings:
        out.append("No active findings: no rule in any layer points at a bottleneck or a failure.")
    for f in findings:
        sev = str(f.get("severity", ""))
        mark = paint(SEVERITY_MARK.get(sev, sev.upper()), sev)
        age = duration(float(f.get("active_for_seconds", 0.0)))
        clearing = ", clearing" if f.get("clearing") else ""
        out.append(f"{mark}  {f.get('id')}  [{f.get('subject')}]  active {age}{clearing}")
        out.append(f"      {f.get('detail') or f.get('title')}")
        for e in f.get("evidence", []):
            threshold = f"  ({e['threshold']})" if e.get("threshold") else ""
            out.append(f"      - {e.get('name')}: {e.get('text')}{threshold}")
        out.append(f"      advice: {f.get('advice')}")
        out.append("")

    risks = sorted(d.get("oom_risk", []), key=lambda r: -float(r.get("ratio", 0.0)))
    if risks:
        out.append("-" * WIDTH)
        out.append("OOM risk (0-100 %)")
        for r in risks:
            if float(r.get("ratio", 0.0)) <= 0:
                continue
            who = f"GPU {r.get('gpu')}" + (f" / {short_target(str(r['target']))}" if r.get("target") else "")
            ratio = float(r.get("ratio", 0.0))
            bar = "#" * round(ratio * 20)
            out.append(f"  {who:<40} {value_text(ratio, 'ratio'):>7} {bar}")
            for reason in r.get("reasons", []):
                out.append(f"  {'':<40}   - {reason}")
        quiet = sum(1 for r in risks if float(r.get("ratio", 0.0)) <= 0)
        if quiet:
            out.append(f"  {quiet} GPU/engine pair(s) at 0 %")

    gpus: Sequence[Mapping[str, Any]] = d.get("gpus", [])
    if gpus:
        out.append("-" * WIDTH)
        out.append(
            f"{'GPU':<5} {'model':<26} {'state':<6} {'SM/util':>8} {'memory':>18} {'temp':>7} "
            f"{'power':>7}  findings"
        )
        by_gpu = _findings_by(findings, "gpu")
        for g in gpus:
            n = _numbers(g)
            act = n.get("SM active") or n.get("utilization") or "-"
            mem = f"{n.get('memory used', '-')} / {n.get('memory total', '-')}"
            state = "up" if g.get("up") else "DOWN"
            ids = ", ".join(sorted(by_gpu.get(str(g.get("key")), set()))) or "-"
            out.append(
                f"{g.get('key')!s:<5} {str(g.get('subtitle', ''))[:26]:<26} {state:<6} {act:>8} {mem:>18} "
                f"{n.get('temperature', '-'):>7} {n.get('power', '-'):>7}  {ids}"
            )

    engines: Sequence[Mapping[str, Any]] = d.get("engines", [])
    if engines:
        out.append("-" * WIDTH)
        out.append(
            f"{'engine':<40} {'GPUs':<10} {'run':>5} {'wait':>5} {'KV':>6} {'tok/s':>8} "
            f"{'TTFT p99':>9}  findings"
        )
        by_engine = _findings_by(findings, "target")
        for e in engines:
            n = _numbers(e)
            state = "" if e.get("up") else " (DOWN)"
            ids = ", ".join(sorted(by_engine.get(str(e.get("key")), set()))) or "-"
            gpus_of = ranges(e.get("gpus", [])) or "-"
            out.append(
                f"{(str(e.get('title')) + state)[:40]:<40} {gpus_of[:10]:<10} {n.get('running', '-'):>5} "
                f"{n.get('waiting', '-'):>5} {n.get('KV-cache usage', '-'):>6} "
                f"{n.get('generated tokens', '-'):>8} {n.get('TTFT p99', '-'):>9}  {ids}"
            )
    return "\n".join(out).rstrip() + "\n"


def ranges(indexes: Sequence[str]) -> str:
    """["0", "1", "2", "5"] -> "0-2,5"."""
    nums = sorted(int(i) for i in indexes if str(i).isdigit())
    out: list[str] = []
    for n in nums:
        if out and n == int(out[-1].rsplit("-", 1)[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)


def _numbers(card: Mapping[str, Any]) -> dict[str, str]:
    return {str(n.get("name")): str(n.get("text")) for n in card.get("numbers", [])}


def _findings_by(findings: Sequence[Mapping[str, Any]], key: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in findings:
        value = str(f.get(key, ""))
        if value:
            out.setdefault(value, set()).add(str(f.get("id")))
    return out


def _when(taken_at: object) -> str:
    if not isinstance(taken_at, int | float):
        return "unknown time"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(taken_at))
