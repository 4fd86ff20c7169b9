"""The HTML page at /: what a person reads first. Self-contained: inline CSS, SVG, a few
lines of JS for refreshing; no CDN, no fonts to fetch, works offline.

Rendered on the server from the same JSON as /api/v1/diagnosis, so the page shows
exactly what the API and the CLI report say.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from exporter.diagnosis import coverage
from exporter.diagnosis.fmt import duration, simulation_line, value_text
from exporter.diagnosis.frame import short_target

REFRESH_S = 10

CSS = """
:root{--bg:#f5f6f8;--card:#fff;--ink:#1d2330;--mute:#667085;--line:#e3e6eb;--ok:#1a7f37;
--crit:#c4291c;--warn:#b76e00;--info:#1f6feb;--spark:#3b6fd8;--bad:#fbe9e7}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,
"DejaVu Sans",sans-serif;background:var(--bg);color:var(--ink)}
header{display:flex;align-items:center;gap:16px;padding:14px 24px;background:#1d2330;color:#fff}
header h1{font-size:18px;margin:0;font-weight:600}header .meta{color:#c9d1e0;font-size:13px}
header .right{margin-left:auto;display:flex;gap:10px;align-items:center}
main{padding:18px 24px;max-width:1500px;margin:auto}
.badge{display:inline-block;padding:2px 9px;border-radius:10px;font-weight:600;font-size:12px;
letter-spacing:.03em;text-transform:uppercase;color:#fff}
.b-ok{background:var(--ok)}.b-critical{background:var(--crit)}.b-warning{background:var(--warn)}
.b-info{background:var(--info)}.b-sim{background:#6e40c9}.b-down{background:var(--crit)}
.summary{display:flex;gap:12px;flex-wrap:wrap;margin-bottom:16px}
.stat{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 16px;min-width:140px}
.stat .v{font-size:22px;font-weight:650}.stat .k{color:var(--mute);font-size:12px}
h2{font-size:15px;margin:22px 0 10px;text-transform:uppercase;letter-spacing:.05em;color:var(--mute)}
.finding{background:var(--card);border:1px solid var(--line);border-left:5px solid var(--info);
border-radius:8px;padding:10px 14px;margin-bottom:10px}
.finding.critical{border-left-color:var(--crit)}.finding.warning{border-left-color:var(--warn)}
.finding .head{display:flex;gap:10px;align-items:baseline;flex-wrap:wrap}
.finding .id{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-weight:600}
.finding .subj{color:var(--mute)}.finding .age{margin-left:auto;color:var(--mute);font-size:12px}
.finding .detail{margin:4px 0}.advice{color:#344054}.advice b{color:var(--ink)}
.ev{display:flex;flex-wrap:wrap;gap:6px;margin:6px 0}
.chip{background:#f0f2f5;border:1px solid var(--line);border-radius:6px;padding:1px 8px;font-size:12.5px}
.chip b{font-weight:650}.chip i{color:var(--mute);font-style:normal}
.none{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:14px;color:var(--ok);
font-weight:600}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(330px,1fr));gap:12px}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:12px 14px}
.card.hasfind{border-color:#f0b9b0}.card.down{background:var(--bad)}
.card h3{margin:0;font-size:15px;display:flex;gap:8px;align-items:center}
.card .sub{color:var(--mute);font-size:12px;margin-bottom:6px;word-break:break-all}
.nums{display:grid;grid-template-columns:1fr 1fr;gap:2px 12px;font-size:12.5px;margin:6px 0}
.nums span{color:var(--mute)}.nums b{float:right;font-weight:600}
.tags{display:flex;flex-wrap:wrap;gap:4px;margin:4px 0}
.tag{font:12px ui-monospace,"DejaVu Sans Mono",monospace;border-radius:4px;padding:1px 6px;color:#fff}
.sparks{display:grid;grid-template-columns:1fr 1fr;gap:6px;margin-top:8px}
.spark{font-size:11.5px;color:var(--mute)}.spark svg{display:block;width:100%;height:34px;background:#fafbfc;
border:1px solid var(--line);border-radius:4px}.spark .last{float:right;color:var(--ink);font-weight:600}
.risk{display:flex;align-items:center;gap:8px;font-size:13px;margin:3px 0}
.risk .who{width:260px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.risk .bar{flex:1;height:10px;background:#eceff3;border-radius:5px;overflow:hidden;max-width:420px}
.risk .bar i{display:block;height:100%}.risk .why{color:var(--mute);font-size:12px}
details,.panel{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:8px 14px}
table{border-collapse:collapse;width:100%;font-size:12.5px}td,th{text-align:left;padding:3px 8px;
border-bottom:1px solid var(--line)}th{color:var(--mute);font-weight:600}
footer{color:var(--mute);font-size:12px;padding:16px 24px}a{color:var(--info)}
"""

JS = (
    """
(function(){var s=document.getElementById('auto');var k='llmgpu-auto';
if(localStorage.getItem(k)==='off'){s.checked=false;}
s.addEventListener('change',function(){localStorage.setItem(k,s.checked?'on':'off');});
setInterval(function(){if(s.checked&&!document.hidden){location.reload();}},MS);})();
"""
).replace("MS", str(REFRESH_S * 1000))

SEV_COLOR = {"critical": "#c4291c", "warning": "#b76e00", "info": "#1f6feb"}


def render_page(d: Mapping[str, Any] | None) -> str:
    if d is None:
        body = '<main><div class="none">Waiting for the first snapshot...</div></main>'
        return _doc("starting", body, refresh=True)
    status = str(d.get("status", "ok"))
    summary = d.get("summary", {})
    findings: Sequence[Mapping[str, Any]] = d.get("findings", [])
    parts = [_header(d, status), "<main>", _summary(summary, findings), "<h2>Active findings</h2>"]
    if findings:
        parts += [_finding(f) for f in findings]
    else:
        parts.append(
            '<div class="none" id="no-findings">'
            "No active findings: no layer shows a bottleneck or a failure.</div>"
        )
    parts.append(coverage.page_section(d.get("blind_spots", [])))
    parts.append(_risks(d.get("oom_risk", [])))
    by_gpu: dict[str, list[Mapping[str, Any]]] = {}
    by_target: dict[str, list[Mapping[str, Any]]] = {}
    for f in findings:
        if f.get("gpu"):
            by_gpu.setdefault(str(f["gpu"]), []).append(f)
        if f.get("target") and not f.get("gpu"):
            by_target.setdefault(str(f["target"]), []).append(f)
    engines = d.get("engines", [])
    if engines:
        parts.append("<h2>Engines</h2><div class='grid'>")
        parts += [_card(e, by_target.get(str(e.get("key")), [])) for e in engines]
        parts.append("</div>")
    parts.append("<h2>GPUs</h2><div class='grid'>")
    parts += [_card(g, by_gpu.get(str(g.get("key")), [])) for g in d.get("gpus", [])]
    parts.append("</div>")
    parts.append(_rules(d.get("rules", []), findings))
    parts.append("</main>")
    parts.append(
        "<footer>llm-gpu-exporter &middot; <a href='metrics'>/metrics</a> &middot; "
        "<a href='api/v1/diagnosis'>/api/v1/diagnosis</a> &middot; trends cover the last "
        f"{escape(duration(float(d.get('history_seconds', 0.0))))}</footer>"
    )
    return _doc(status, "".join(parts), refresh=True)


def _doc(status: str, body: str, refresh: bool) -> str:
    script = f"<script>{JS}</script>" if refresh else ""
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>{escape(status.upper())} - llm-gpu-exporter diagnosis</title>"
        f"<style>{CSS}</style></head><body>{body}{script}</body></html>"
    )


def _header(d: Mapping[str, Any], status: str) -> str:
    taken = d.get("taken_at")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(taken)) if isinstance(taken, int | float) else "-"
    )
    sim = "<span class='badge b-sim'>simulated</span>" if d.get("simulated") else ""
    played = d.get("simulation")
    # A simulation runs on the scenario's clock, faster than the wall's: say where the story
    # is rather than a wall-clock time the snapshot does not have.
    meta = f"snapshot {escape(when)}" if not isinstance(played, Mapping) else escape(simulation_line(played))
    return (
        "<header><h1>LLM GPU node diagnosis</h1>"
        f"<span class='badge b-{escape(status)}' id='status'>{escape(status)}</span>{sim}"
        f"<span class='meta' id='clock'>{meta}</span>"
        "<span class='right meta'><label>"
        "<input type='checkbox' id='auto' checked> auto-refresh</label></span>"
        "</header>"
    )


def _summary(s: Mapping[str, Any], findings: Sequence[Mapping[str, Any]]) -> str:
    worst = s.get("max_oom_risk") or {}
    sev = s.get("by_severity", {})
    stats = [
        (f"{s.get('gpus_up', 0)}/{s.get('gpus', 0)}", "GPUs up"),
        (f"{s.get('engines_up', 0)}/{s.get('engines', 0)}", "engines up"),
        (
            str(len(findings)),
            f"findings ({sev.get('critical', 0)} critical, {sev.get('warning', 0)} warning)",
        ),
        (value_text(worst.get("ratio"), "ratio") if worst else "n/a", "highest OOM risk"),
    ]
    layers = sorted({str(f.get("layer")) for f in findings})
    if layers:
        stats.append((", ".join(layers), "layers involved"))
    return (
        "<div class='summary'>"
        + "".join(
            f"<div class='stat'><div class='v'>{escape(v)}</div><div class='k'>{escape(k)}</div></div>"
            for v, k in stats
        )
        + "</div>"
    )


def _chips(evidence: Sequence[Mapping[str, Any]]) -> str:
    out = []
    for e in evidence:
        th = f" <i>{escape(str(e['threshold']))}</i>" if e.get("threshold") else ""
        out.append(
            f"<span class='chip'>{escape(str(e.get('name')))}: <b>{escape(str(e.get('text')))}</b>{th}</span>"
        )
    return "<div class='ev'>" + "".join(out) + "</div>"


def _finding(f: Mapping[str, Any]) -> str:
    sev = escape(str(f.get("severity", "info")))
    age = duration(float(f.get("active_for_seconds", 0.0)))
    clearing = " &middot; clearing" if f.get("clearing") else ""
    return (
        f"<div class='finding {sev}' data-finding='{escape(str(f.get('id')))}'>"
        f"<div class='head'><span class='badge b-{sev}'>{sev}</span>"
        f"<span class='id'>{escape(str(f.get('id')))}</span>"
        f"<span class='subj'>{escape(str(f.get('subject')))}</span>"
        f"<span class='age'>active {escape(age)}{clearing}</span></div>"
        f"<div class='detail'>{escape(str(f.get('detail') or f.get('title')))}</div>"
        f"{_chips(f.get('evidence', []))}"
        f"<div class='advice'><b>Advice:</b> {escape(str(f.get('advice')))}</div></div>"
    )


def _risk_color(r: float) -> str:
    return "#c4291c" if r >= 0.6 else "#b76e00" if r >= 0.3 else "#1a7f37"


def _risks(risks: Sequence[Mapping[str, Any]]) -> str:
    if not risks:
        return ""
    rows = []
    ordered = sorted(risks, key=lambda x: (-float(x.get("ratio", 0.0)), str(x.get("gpu")).zfill(4)))
    scored = [r for r in ordered if float(r.get("ratio", 0.0)) > 0]
    for r in scored:
        ratio = float(r.get("ratio", 0.0))
        target = str(r.get("target") or "")
        who = f"GPU {r.get('gpu')}" + (f" / {short_target(target)}" if target else "")
        why = "; ".join(str(x) for x in r.get("reasons", []))
        rows.append(
            f"<div class='risk'><span class='who' title='{escape(target)}'>{escape(who)}</span>"
            f"<span class='bar'><i style='width:{max(ratio * 100, 1):.1f}%;"
            f"background:{_risk_color(ratio)}'></i></span>"
            f"<b>{escape(value_text(ratio, 'ratio'))}</b><span class='why'>{escape(why)}</span></div>"
        )
    quiet = len(ordered) - len(scored)
    if quiet:
        gpus = sorted(
            {str(r.get("gpu")) for r in ordered if float(r.get("ratio", 0.0)) == 0}, key=lambda g: g.zfill(4)
        )
        rows.append(
            f"<div class='risk'><span class='why'>{quiet} GPU/engine pair(s) at 0 % "
            f"(GPU {escape(', '.join(gpus))}): memory inside the engines' budgets, nothing growing"
            "</span></div>"
        )
    return "<h2>OOM risk</h2><div class='panel'>" + "".join(rows) + "</div>"


def _card(c: Mapping[str, Any], findings: Sequence[Mapping[str, Any]]) -> str:
    up = bool(c.get("up"))
    cls = "card" + ("" if up else " down") + (" hasfind" if findings else "")
    state = "" if up else "<span class='badge b-down'>down</span>"
    tags = "".join(
        f"<span class='tag' style='background:{SEV_COLOR.get(str(f.get('severity')), '#667085')}'>"
        f"{escape(str(f.get('id')))}</span>"
        for f in findings
    )
    gpus = c.get("gpus") or []
    sub = str(c.get("subtitle", ""))
    if gpus:
        sub += f" · GPUs {', '.join(gpus)}"
    nums = "".join(
        f"<div><span>{escape(str(n.get('name')))}</span><b>{escape(str(n.get('text')))}</b></div>"
        for n in c.get("numbers", [])
    )
    sparks = "".join(_spark(t) for t in c.get("trends", []))
    return (
        f"<div class='{cls}' data-{escape(str(c.get('kind')))}='{escape(str(c.get('key')))}'>"
        f"<h3>{escape(str(c.get('title')))} {state}</h3><div class='sub'>{escape(sub)}</div>"
        f"<div class='tags'>{tags}</div><div class='nums'>{nums}</div>"
        f"<div class='sparks'>{sparks}</div></div>"
    )


def _spark(t: Mapping[str, Any]) -> str:
    pts = [(float(x), float(y)) for x, y in t.get("points", [])]
    unit = str(t.get("unit", ""))
    last = value_text(pts[-1][1], unit) if pts else "n/a"
    w, h = 160.0, 34.0
    svg = f"<svg viewBox='0 0 {w:.0f} {h:.0f}' preserveAspectRatio='none' role='img'>"
    if len(pts) >= 2:
        x0, x1 = pts[0][0], pts[-1][0]
        ys = [y for _, y in pts]
        lo, hi = (0.0, max(1.0, max(ys))) if unit == "ratio" else (min(0.0, min(ys)), max(ys))
        span_x, span_y = (x1 - x0) or 1.0, (hi - lo) or 1.0
        coords = " ".join(
            f"{(x - x0) / span_x * (w - 2) + 1:.1f},{h - 2 - (y - lo) / span_y * (h - 4):.1f}" for x, y in pts
        )
        svg += (
            f"<polyline fill='none' stroke='#3b6fd8' stroke-width='1.6' points='{coords}'/>"
            f"<title>{escape(str(t.get('name')))}: {escape(value_text(lo, unit))} - "
            f"{escape(value_text(hi, unit))}</title>"
        )
    svg += "</svg>"
    return (
        f"<div class='spark'>{escape(str(t.get('name')))}<span class='last'>{escape(last)}</span>{svg}</div>"
    )


def _rules(rules: Sequence[Mapping[str, Any]], findings: Sequence[Mapping[str, Any]]) -> str:
    active: dict[str, int] = {}
    for f in findings:
        active[str(f.get("id"))] = active.get(str(f.get("id")), 0) + 1
    rows = "".join(
        f"<tr><td><code>{escape(str(r.get('id')))}</code></td><td>{escape(str(r.get('severity')))}</td>"
        f"<td>{escape(str(r.get('title')))}</td><td>{active.get(str(r.get('id')), 0) or ''}</td></tr>"
        for r in rules
    )
    return (
        f"<h2>Rules</h2><details><summary>{len(rules)} rules evaluated every snapshot "
        "(docs/diagnosis.md has thresholds and reasons)</summary>"
        "<table><tr><th>rule</th><th>severity</th><th>what it says</th><th>active</th></tr>"
        f"{rows}</table></details>"
    )
