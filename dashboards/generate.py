"""Generate the Grafana JSON beside each dashboards/*.dashboard.py, or check it is current.

python -m dashboards.generate          write dashboards/<name>.json
python -m dashboards.generate --check  exit 1 when a JSON file is stale or a dashboard
                                       breaks a convention (uid, datasource variable,
                                       metric names the exporter does not declare)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from grafanalib._gen import DashboardEncoder
from grafanalib.core import Dashboard

from dashboards import catalog
from dashboards.common import DATASOURCE, metric_names, queries

HERE = Path(__file__).resolve().parent
SUFFIX = ".dashboard.py"


def sources() -> list[Path]:
    return sorted(HERE.glob(f"*{SUFFIX}"))


def load(path: Path) -> Dashboard:
    """The `dashboard` object a *.dashboard.py source defines (grafanalib's convention)."""
    name = "dashboards._" + path.name.removesuffix(SUFFIX).replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    board = getattr(module, "dashboard", None)
    if not isinstance(board, Dashboard):
        raise SystemExit(f"{path.name}: defines no `dashboard` (grafanalib Dashboard)")
    return board


def output(path: Path) -> Path:
    return path.with_name(path.name.removesuffix(SUFFIX) + ".json")


def render(board: Dashboard) -> str:
    return json.dumps(board.to_json_data(), cls=DashboardEncoder, sort_keys=True, indent=2) + "\n"


def boards() -> dict[Path, Dashboard]:
    return {path: load(path) for path in sources()}


def conventions(board: Dashboard) -> list[str]:
    """What a dashboard gets wrong against the project's conventions."""
    out: list[str] = []
    if not board.uid or not board.uid.startswith("llmgpu-"):
        out.append(f"uid {board.uid!r} must be set and start with 'llmgpu-'")
    variables = board.templating.list
    if not variables or variables[0].name != "datasource" or variables[0].type != "datasource":
        out.append("the first variable must be the datasource variable")
    used: set[str] = set()
    for panel in board._iter_panels():
        if getattr(panel, "targets", None) is None or panel.__class__.__name__ in ("RowPanel", "Text"):
            continue
        if panel.dataSource != DATASOURCE:
            out.append(f"panel {panel.title!r}: datasource must be {DATASOURCE}")
        if not panel.targets:
            out.append(f"panel {panel.title!r}: no query")
        if not panel.description or "Metric" not in panel.description:
            out.append(f"panel {panel.title!r}: description must end with the metrics it reads")
        refs = [t.refId for t in panel.targets]
        if len(set(refs)) != len(refs):
            out.append(f"panel {panel.title!r}: duplicate refId")
    for _title, query in queries(board):
        used |= set(metric_names(query.expr))
    out += catalog.problems(sorted(used))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.generate", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail on stale JSON instead of writing it")
    args = parser.parse_args(argv)

    failed = False
    uids: dict[str, Path] = {}
    for path, board in boards().items():
        for problem in conventions(board):
            print(f"{path.name}: {problem}", file=sys.stderr)
            failed = True
        if board.uid in uids:
            print(f"{path.name}: uid {board.uid} already used by {uids[board.uid].name}", file=sys.stderr)
            failed = True
        uids[board.uid] = path
        text = render(board)
        target = output(path)
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current == text:
            continue
        if args.check:
            print(
                f"{target.relative_to(HERE.parent)} is stale: run python -m dashboards.generate",
                file=sys.stderr,
            )
            failed = True
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target.relative_to(HERE.parent)}")
    for stray in sorted(HERE.glob("*.json")):
        if not (HERE / (stray.stem + SUFFIX)).exists():
            print(f"{stray.name} has no {stray.stem}{SUFFIX} source", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
