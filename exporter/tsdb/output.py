"""What `diagnose --prometheus` prints: one node's report, or the fleet's.

A node's report is the live one (`render_text`, `Diagnosis.to_json`) with a `source`
block saying where and when it was rebuilt, and for a span the findings that were
active at some point of it. The fleet report lists every node with its active findings
at the end of the span, worst first.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from exporter.diagnosis.fmt import duration
from exporter.diagnosis.model import SEVERITIES
from exporter.diagnosis.report import SEVERITY_MARK, WIDTH, render_text
from exporter.tsdb.replay import NodeKey, NodeResult, Request

RANK = {s: i for i, s in enumerate((*SEVERITIES, "ok"))}


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def source_json(url: str, req: Request, result: NodeResult | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "url": url,
        "from": req.start,
        "to": req.end,
        "history_from": req.fetch_from,
        "time_scale": req.time_scale,
    }
    if result is not None:
        out.update(
            step_seconds=result.step,
            instance=result.key.instance,
            node=result.key.node,
            frames=result.frames,
            first_sample=result.first_sample,
            last_sample=result.last_sample,
        )
    return out


def node_json(url: str, req: Request, result: NodeResult) -> dict[str, Any]:
    data = result.diagnosis.to_json()
    data["source"] = source_json(url, req, result)
    if req.start < req.end:
        data["span_findings"] = [e.to_json() for e in result.episodes]
    return data


def node_text(data: dict[str, Any]) -> str:
    src = data.get("source", {})
    head = (
        f"From {src.get('url')}: {NodeKey(src.get('instance', ''), src.get('node', ''))}, "
        f"{src.get('frames', 0)} samples every {src.get('step_seconds', '?')} s"
    )
    if src.get("time_scale", 1.0) != 1.0:
        head += f", time scale {src['time_scale']:g}"
    out = [head, render_text(data).rstrip()]
    if "span_findings" in data:
        out.append("-" * WIDTH)
        out.append(f"Findings active between {_when(src['from'])} and {_when(src['to'])}")
        episodes = data["span_findings"]
        if not episodes:
            out.append("  none")
        for e in episodes:
            mark = SEVERITY_MARK.get(e["severity"], e["severity"])
            end = "still active" if e["active_at_end"] else f"until {_when(e['to'])}"
            out.append(f"  {mark}  {e['id']}  [{e['subject']}]  from {_when(e['from'])}, {end}")
    return "\n".join(out)


def _order(node: dict[str, Any]) -> tuple[Any, ...]:
    by = node["summary"].get("by_severity", {})
    return (RANK.get(node["status"], 9), *(-by.get(s, 0) for s in SEVERITIES), node["instance"])


def fleet_json(
    url: str, req: Request, results: Sequence[NodeResult], silent: Sequence[NodeKey]
) -> dict[str, Any]:
    nodes = []
    for r in results:
        d = r.diagnosis.to_json()
        nodes.append(
            {
                "instance": r.key.instance,
                "node": r.key.node,
                "status": d["status"],
                "taken_at": d["taken_at"],
                "simulated": d["simulated"],
                "summary": d["summary"],
                "findings": d["findings"],
            }
        )
    nodes.sort(key=_order)
    worst = min((n["status"] for n in nodes), key=lambda s: RANK.get(s, 9), default="ok")
    by_sev = {s: sum(n["summary"]["by_severity"].get(s, 0) for n in nodes) for s in SEVERITIES}
    return {
        "taken_at": req.end,
        "status": worst,
        "summary": {
            "nodes": len(nodes),
            "nodes_with_findings": sum(1 for n in nodes if n["findings"]),
            "by_severity": by_sev,
            "silent_nodes": len(silent),
        },
        "nodes": nodes,
        "silent": [{"instance": k.instance, "node": k.node} for k in silent],
        "source": {**source_json(url, req, None), "step_seconds": results[0].step if results else None},
    }


def fleet_text(data: dict[str, Any]) -> str:
    s = data["summary"]
    out = [
        f"Fleet diagnosis at {_when(data['taken_at'])}: {data['status'].upper()} - {s['nodes']} node(s), "
        f"{s['nodes_with_findings']} with active findings (from {data['source']['url']})",
        "=" * WIDTH,
        f"{'node':<34} {'status':<8} {'GPUs':>7} {'engines':>8}  findings",
    ]
    for n in data["nodes"]:
        sm = n["summary"]
        ids = ", ".join(sorted({f["id"] for f in n["findings"]})) or "-"
        who = str(NodeKey(n["instance"], n["node"]))
        out.append(
            f"{who[:34]:<34} {n['status'].upper():<8} {sm['gpus_up']:>3}/{sm['gpus']:<3} "
            f"{sm['engines_up']:>3}/{sm['engines']:<4}  {ids}"
        )
    for n in data["nodes"]:
        if not n["findings"]:
            continue
        out.append("-" * WIDTH)
        out.append(str(NodeKey(n["instance"], n["node"])))
        for f in n["findings"]:
            mark = SEVERITY_MARK.get(f["severity"], f["severity"])
            age = duration(float(f.get("active_for_seconds", 0.0)))
            out.append(f"  {mark}  {f['id']}  [{f['subject']}]  active {age}")
            out.append(f"        {f.get('detail') or f.get('title')}")
    if data["silent"]:
        out.append("-" * WIDTH)
        names = ", ".join(str(NodeKey(k["instance"], k["node"])) for k in data["silent"])
        out.append(f"No sample during the span from: {names}")
    return "\n".join(out)


def fleet_exit_code(data: dict[str, Any]) -> int:
    return 1 if any(n["findings"] for n in data["nodes"]) else 0
