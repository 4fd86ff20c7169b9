"""Small typed helpers the *.dashboard.py sources share.

Edit the panels in the dashboard sources and run `python -m dashboards.generate`; the
JSON beside them is generated and a test fails when it is stale. Every query carries
the simulator scenarios in which it must return data; the live tests run them against a
real Prometheus scraping the exporter in simulation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import attr
from grafanalib import core as g

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
TAG = "llm-gpu-exporter"

# Scenarios of exporter/sim/scenarios. HEALTHY is the default expectation: a panel that
# shows the normal state of a node must have data on a healthy node.
HEALTHY = ("healthy",)
# Queries no scenario can feed, so the live tests skip them (and list them): the allocator
# probe runs inside a real engine (tests/e2e exercises it), and no scenario injects NVLink
# errors or runs speculative decoding.
PROBE_ONLY: tuple[str, ...] = ()
NOT_SIMULATED: tuple[str, ...] = ()

# Label selectors, filled from the dashboard variables.
CLUSTER = 'cluster=~"$cluster"'
NODE = f'{CLUSTER}, instance=~"$node"'
GPU = f'{NODE}, gpu=~"$gpu"'
ENGINE = f'{NODE}, model=~"$model", target=~"$target"'

# Label sets that identify a GPU and an engine target across the fleet.
ON_GPU = "on (cluster, job, instance, uuid)"
ON_NODE = "on (cluster, job, instance)"


@attr.s
class Query(g.Target):
    """A Prometheus target, plus the scenarios where it must return data (not exported)."""

    scenarios: tuple[str, ...] = attr.ib(default=HEALTHY, converter=tuple)


def q(
    expr: str,
    legend: str = "",
    scenarios: Iterable[str] = HEALTHY,
    *,
    instant: bool = False,
    fmt: str = "time_series",
) -> Query:
    return Query(
        expr=_tidy(expr),
        legendFormat=legend,
        scenarios=tuple(scenarios),
        instant=instant,
        format=fmt,
        datasource=DATASOURCE,
        intervalFactor=1,
        step=None,
    )


def divide(num: str, den: str) -> str:
    """num / den that draws nothing (not NaN or Inf) while the denominator is 0."""
    return f"({num})\n/\n(({den}) > 0)"


def rate(metric: str, selector: str, by: str | None = None, window: str = "$__rate_interval") -> str:
    inner = f"rate({metric}{{{selector}}}[{window}])"
    return f"sum by ({by}) ({inner})" if by is not None else inner


def quantile(phi: float, metric: str, selector: str, by: str = "model") -> str:
    return (
        f"histogram_quantile({phi}, sum by (le, {by}) "
        f"(rate({metric}_bucket{{{selector}}}[$__rate_interval])))"
    )


# ---- panels ----------------------------------------------------------------------------


def _tidy(expr: str) -> str:
    return "\n".join(line.rstrip() for line in expr.strip().splitlines())


_NAME = re.compile(r"\b[a-z_]+:[a-zA-Z0-9_]+:[a-zA-Z0-9_]+\b|\bllmgpu_[a-z0-9_]+\b|\bup\b(?=\{)")


def metric_names(expr: str) -> list[str]:
    """Metric and recording-rule names an expression reads, in order of appearance."""
    seen: list[str] = []
    for match in _NAME.finditer(re.sub(r'"[^"]*"', '""', expr)):
        name = match.group(0)
        if name not in seen:
            seen.append(name)
    return seen


def _describe(text: str, targets: Sequence[Query]) -> str:
    names: list[str] = []
    for t in targets:
        names += [n for n in metric_names(t.expr) if n not in names]
    label = "Metric" if len(names) == 1 else "Metrics"
    return f"{text.strip()}\n\n{label}: {', '.join(f'`{n}`' for n in names)}."


def _refs(targets: Sequence[Query]) -> list[Query]:
    return [attr.evolve(t, refId=chr(ord("A") + i)) for i, t in enumerate(targets)]


@attr.s(frozen=True)
class Sized:
    """A panel and the grid cells it takes; `layout` gives it its position."""

    panel: g.Panel = attr.ib()
    w: int = attr.ib(default=12)
    h: int = attr.ib(default=8)


def thresholds(*steps: tuple[str, float | None]) -> list[dict[str, object]]:
    """Threshold steps as Grafana stores them: the base step's value is null."""
    return [{"color": color, "value": None if i == 0 else value} for i, (color, value) in enumerate(steps)]


def timeseries(
    title: str,
    description: str,
    targets: Sequence[Query],
    *,
    unit: str = "short",
    w: int = 12,
    h: int = 8,
    stack: bool = False,
    max_: int | None = None,
    min_: int | None = None,
    threshold: float | None = None,
    bars: bool = False,
    legend: str = "list",
    right_axis: dict[str, str] | None = None,
) -> Sized:
    """`right_axis` maps a text in a series' legend to the unit of a right-hand axis for it."""
    overrides: dict[str, object] = {}
    if threshold is not None:
        overrides = {
            "fieldConfig": {
                "defaults": {
                    "thresholds": {
                        "mode": "absolute",
                        "steps": [
                            {"color": "green", "value": None},
                            {"color": "red", "value": threshold},
                        ],
                    },
                    "custom": {"thresholdsStyle": {"mode": "dashed"}},
                }
            }
        }
    panel = g.TimeSeries(
        title=title,
        description=_describe(description, targets),
        dataSource=DATASOURCE,
        targets=_refs(targets),
        unit=unit,
        stacking={"mode": "normal", "group": "A"} if stack else {},
        fillOpacity=30 if stack or bars else 10,
        drawStyle="bars" if bars else "line",
        valueMin=min_,
        valueMax=max_,
        legendDisplayMode=legend,
        legendPlacement="bottom",
        legendCalcs=["mean", "max", "lastNotNull"] if legend == "table" else [],
        tooltipMode="multi",
        tooltipSort="desc",
        showPoints="never",
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": f".*{text}.*"},
                "properties": [
                    {"id": "custom.axisPlacement", "value": "right"},
                    {"id": "unit", "value": axis_unit},
                ],
            }
            for text, axis_unit in (right_axis or {}).items()
        ],
        extraJson=overrides or None,
    )
    return Sized(panel, w, h)


def stat(
    title: str,
    description: str,
    targets: Sequence[Query],
    *,
    unit: str = "short",
    w: int = 4,
    h: int = 4,
    steps: Sequence[tuple[str, float | None]] = (("green", None),),
    text_mode: str = "auto",
    graph: bool = False,
    decimals: int | None = None,
) -> Sized:
    panel = g.Stat(
        title=title,
        description=_describe(description, targets),
        dataSource=DATASOURCE,
        targets=_refs(targets),
        format=unit,
        reduceCalc="lastNotNull",
        graphMode="area" if graph else "none",
        textMode=text_mode,
        colorMode="value",
        color={"mode": "thresholds"},
        noValue="no data",
        decimals=decimals,
        thresholds=thresholds(*steps),
    )
    return Sized(panel, w, h)


def heatmap(
    title: str, description: str, target: Query, *, unit: str = "percentunit", w: int = 8, h: int = 9
) -> Sized:
    """One row per series (node), one cell per step, colour = value."""
    panel = g.Heatmap(
        title=title,
        description=_describe(description, [target]),
        dataSource=DATASOURCE,
        targets=_refs([target]),
        dataFormat="timeseries",
        hideZeroBuckets=False,
        extraJson={
            "options": {
                "calculate": False,
                "cellGap": 1,
                "color": {
                    "mode": "scheme",
                    "scheme": "Oranges",
                    "fill": "dark-orange",
                    "min": 0,
                    "max": 1,
                    "steps": 64,
                },
                "rowsFrame": {"layout": "auto"},
                "yAxis": {"axisPlacement": "left", "unit": "", "reverse": False},
                "cellValues": {"unit": unit},
                "tooltip": {"show": True, "yHistogram": False},
                "legend": {"show": True},
                "showValue": "never",
                "exemplars": {"color": "rgba(255,0,255,0.7)"},
            },
            "fieldConfig": {"defaults": {"unit": unit}},
        },
    )
    return Sized(panel, w, h)


def table(
    title: str,
    description: str,
    targets: Sequence[Query],
    *,
    w: int = 12,
    h: int = 8,
    unit: str = "short",
    hide: Sequence[str] = ("Time", "__name__", "job"),
    rename: dict[str, str] | None = None,
) -> Sized:
    """Instant queries shown as one row per series, the labels as columns."""
    transformations: list[dict[str, object]] = [{"id": "merge", "options": {}}]
    transformations.append(
        {
            "id": "organize",
            "options": {
                "excludeByName": {name: True for name in hide},
                "renameByName": rename or {},
            },
        }
    )
    panel = g.Table(
        title=title,
        description=_describe(description, targets),
        dataSource=DATASOURCE,
        targets=_refs(targets),
        unit=unit,
        filterable=True,
        transformations=transformations,
    )
    return Sized(panel, w, h)


def bargauge(
    title: str,
    description: str,
    targets: Sequence[Query],
    *,
    unit: str = "short",
    w: int = 8,
    h: int = 8,
    max_: float | None = None,
    steps: Sequence[tuple[str, float | None]] = (("green", None),),
) -> Sized:
    panel = BarGauge(
        title=title,
        description=_describe(description, targets),
        dataSource=DATASOURCE,
        targets=_refs(targets),
        unit=unit,
        max_=max_,
        thresholds=thresholds(*steps),
    )
    return Sized(panel, w, h)


@attr.s
class BarGauge(g.Panel):
    """A bar gauge in the current panel schema (grafanalib's writes Grafana 6 `fieldOptions`)."""

    unit: str = attr.ib(default="short")
    max_: float | None = attr.ib(default=None)

    def to_json_data(self) -> dict[str, object]:
        return self.panel_json(  # type: ignore[no-any-return]
            {
                "fieldConfig": {
                    "defaults": {"unit": self.unit, "min": 0, "max": self.max_},
                    "overrides": [],
                },
                "options": {
                    "displayMode": "gradient",
                    "orientation": "horizontal",
                    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "showUnfilled": True,
                },
                "type": "bargauge",
            }
        )


def state_timeline(
    title: str, description: str, targets: Sequence[Query], *, w: int = 24, h: int = 9
) -> Sized:
    panel = g.StateTimeline(
        title=title,
        description=_describe(description, targets),
        dataSource=DATASOURCE,
        targets=_refs(targets),
        mappings=[
            {
                "type": "value",
                "options": {
                    "0": {"text": "clear", "color": "transparent"},
                    "1": {"text": "active", "color": "red"},
                },
            }
        ],
        mergeValues=True,
        showValue="never",
        rowHeight=0.8,
    )
    return Sized(panel, w, h)


def text(content: str, *, w: int = 24, h: int = 3) -> Sized:
    return Sized(g.Text(title="", content=content.strip(), mode="markdown", transparent=True), w, h)


@attr.s(frozen=True)
class Row:
    title: str = attr.ib()
    panels: Sequence[Sized] = attr.ib()
    collapsed: bool = attr.ib(default=False)


def layout(rows: Sequence[Row]) -> list[g.Panel]:
    """Rows top to bottom; panels flow left to right and wrap at 24 columns."""
    out: list[g.Panel] = []
    y = 0
    for row in rows:
        placed: list[g.Panel] = []
        x, line_h = 0, 0
        y_row = y
        y += 1
        for item in row.panels:
            if x + item.w > 24:
                x, y, line_h = 0, y + line_h, 0
            placed.append(attr.evolve(item.panel, gridPos=g.GridPos(h=item.h, w=item.w, x=x, y=y)))
            x += item.w
            line_h = max(line_h, item.h)
        y += line_h
        if row.collapsed:
            out.append(
                g.RowPanel(
                    title=row.title, collapsed=True, panels=placed, gridPos=g.GridPos(h=1, w=24, x=0, y=y_row)
                )
            )
        else:
            out.append(g.RowPanel(title=row.title, gridPos=g.GridPos(h=1, w=24, x=0, y=y_row)))
            out.extend(placed)
    return out


# ---- variables -------------------------------------------------------------------------


def datasource_var() -> g.Template:
    return g.Template(
        name="datasource", label="Data source", query="prometheus", type="datasource", default=""
    )


def query_var(
    name: str,
    label: str,
    query: str,
    *,
    multi: bool = True,
    include_all: bool = True,
    hide: int = 0,
) -> g.Template:
    return g.Template(
        name=name,
        label=label,
        query=query,
        dataSource=DATASOURCE,
        includeAll=include_all,
        allValue=".*" if include_all else None,
        multi=multi,
        default="All" if include_all else None,
        refresh=2,  # on time range change: new nodes and GPUs appear without a reload
        sort=3,  # numerical ascending, so GPU 10 sorts after GPU 9
        hide=hide,
    )


def custom_var(name: str, label: str, values: Sequence[str]) -> g.Template:
    return g.Template(
        name=name,
        label=label,
        query=",".join(values),
        type="custom",
        includeAll=True,
        allValue=".*",
        multi=True,
        default="All",
    )


def cluster_var() -> g.Template:
    # `cluster` exists only where relabelling sets it; "All" (.*) also matches its absence.
    return query_var("cluster", "Cluster", "label_values(llmgpu_exporter_build_info, cluster)")


def node_var(multi: bool = True) -> g.Template:
    return query_var(
        "node", "Node", 'label_values(llmgpu_exporter_build_info{cluster=~"$cluster"}, instance)', multi=multi
    )


def gpu_var() -> g.Template:
    return query_var(
        "gpu", "GPU", 'label_values(llmgpu_gpu_info{cluster=~"$cluster", instance=~"$node"}, gpu)'
    )


def model_var() -> g.Template:
    return query_var(
        "model", "Model", 'label_values(llmgpu_engine_up{cluster=~"$cluster", instance=~"$node"}, model)'
    )


def target_var() -> g.Template:
    return query_var(
        "target",
        "Engine target",
        'label_values(llmgpu_engine_up{cluster=~"$cluster", instance=~"$node", model=~"$model"}, target)',
    )


# ---- dashboards ------------------------------------------------------------------------


def dashboard(
    *,
    title: str,
    uid: str,
    description: str,
    variables: Sequence[g.Template],
    rows: Sequence[Row],
    time_from: str = "now-3h",
) -> g.Dashboard:
    return g.Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=[TAG],
        timezone="browser",
        refresh="30s",
        time=g.Time(time_from, "now"),
        graphTooltip=1,  # shared crosshair
        schemaVersion=37,  # every panel is written in the current schema: no migration on load
        editable=True,
        templating=g.Templating(list=[datasource_var(), *variables]),
        links=[
            {
                "title": "LLM GPU dashboards",
                "type": "dashboards",
                "tags": [TAG],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
                "icon": "external link",
                "targetBlank": False,
            }
        ],
        panels=layout(rows),
    ).auto_panel_ids()


def queries(board: g.Dashboard) -> list[tuple[str, Query]]:
    """(panel title, query) for every query of every panel, rows included."""
    out: list[tuple[str, Query]] = []
    for panel in board._iter_panels():
        for t in getattr(panel, "targets", []):
            if isinstance(t, Query):
                out.append((panel.title, t))
    return out
