"""Command line: `serve`, `snapshot` and `diagnose`."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import time
from typing import Any

from exporter import __version__
from exporter.config import DEFAULT_PORT, ConfigError, Settings, load
from exporter.nvml import NvmlUnavailable
from exporter.sim.scenario import ScenarioError, builtin_names

EXIT_NO_DRIVER = 1
EXIT_USAGE = 2
EXIT_TSDB_UNREACHABLE = 3  # diagnose --prometheus: the query API cannot be used
EXIT_UNKNOWN_NODE = 4
EXIT_NO_DATA = 5
PASSWORD_ENV = "LLMGPU_PROMETHEUS_PASSWORD"
NO_DRIVER_HINT = "try `llm-gpu-exporter serve --simulate healthy` for a demo on simulated GPUs"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML settings file (keys as below, snake_case)")
    sim = p.add_mutually_exclusive_group()
    sim.add_argument(
        "--simulate", metavar="NAME", help="run on simulated GPUs and engines: a built-in scenario"
    )
    sim.add_argument("--scenario-file", metavar="FILE", help="run a scenario from a YAML file")
    p.add_argument("--speed", type=float, help="scenario seconds per wall second (default 1)")
    p.add_argument("--interval", type=float, help="seconds between snapshots (default 1)")
    p.add_argument(
        "--engine",
        dest="engines",
        action="append",
        metavar="URL",
        help="an inference engine's /metrics URL, optionally TYPE=URL (repeatable)",
    )
    p.add_argument("--log-level", help="debug, info, warning or error")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="llm-gpu-exporter", description="GPU + LLM-engine exporter that explains itself."
    )
    top.add_argument("--version", action="version", version=__version__)
    sub = top.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve /metrics, the diagnosis page and the JSON API")
    _common(serve)
    serve.add_argument("--listen", help=f"HOST:PORT (default 0.0.0.0:{DEFAULT_PORT})")
    serve.add_argument("--web-config-file", help="TLS and basic-auth settings (Prometheus web config format)")
    serve.add_argument("--probe-dir", help="allocator probe directory")
    serve.add_argument("--kubelet-socket", help="kubelet pod-resources socket, for pod attribution")
    serve.add_argument(
        "--discover-kubernetes",
        action="store_true",
        default=None,
        help="scrape annotated engine pods on this node (NODE_NAME)",
    )
    serve.add_argument(
        "--no-discover-processes",
        dest="discover_processes",
        action="store_false",
        default=None,
        help="do not look for engine processes on this host",
    )
    serve.add_argument(
        "--collector",
        dest="collectors_enabled",
        action="append",
        metavar="NAME",
        help="enable a collector that is off by default (repeatable)",
    )
    serve.add_argument(
        "--no-collector",
        dest="collectors_disabled",
        action="append",
        metavar="NAME",
        help="disable a collector (repeatable)",
    )

    snap = sub.add_parser("snapshot", help="print one sample as a table")
    _common(snap)
    snap.add_argument("--json", action="store_true", help="print the snapshot as JSON")

    diag = sub.add_parser("diagnose", help="report what slows the node down or puts it at OOM risk")
    _common(diag)
    diag.add_argument("--url", help="ask a running exporter (http://host:port) instead of sampling here")
    diag.add_argument(
        "--step",
        help="seconds per step: scenario seconds with --simulate (default 5), the query step with "
        "--prometheus (default: the scrape interval)",
    )
    diag.add_argument("--format", choices=("text", "json"), default="text", help="report format")
    _tsdb_flags(diag)
    return top


def _tsdb_flags(diag: argparse.ArgumentParser) -> None:
    t = diag.add_argument_group("diagnosis from Prometheus or VictoriaMetrics (--prometheus)")
    t.add_argument("--prometheus", metavar="URL", help="rebuild the diagnosis from this query API")
    t.add_argument("--instance", help="the node's instance label (host:port); without it: every node")
    t.add_argument("--node", help="the node's node label (set by the Helm chart's relabelling)")
    t.add_argument("--selector", metavar="MATCHERS", help='extra label matchers, e.g. cluster="prod"')
    t.add_argument("--at", metavar="TIME", help="the moment: RFC3339, unix seconds, now-1h (default now)")
    t.add_argument("--from", dest="span_from", metavar="TIME", help="start of a span (with --to)")
    t.add_argument("--to", dest="span_to", metavar="TIME", help="end of a span (default now)")
    t.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="seconds the data means per stored second: the exporter's --speed for a simulation",
    )
    t.add_argument("--prometheus-user", metavar="USER", help="basic-auth user")
    t.add_argument(
        "--prometheus-password-file",
        metavar="FILE",
        help=f"basic-auth password file (else ${PASSWORD_ENV})",
    )
    t.add_argument("--prometheus-bearer-token-file", metavar="FILE", help="bearer token file")
    t.add_argument("--prometheus-ca", metavar="FILE", help="CA bundle the server's certificate must chain to")
    t.add_argument("--prometheus-cert", metavar="FILE", help="client certificate (PEM)")
    t.add_argument("--prometheus-key", metavar="FILE", help="client certificate key (PEM)")
    t.add_argument(
        "--prometheus-insecure-skip-verify", action="store_true", help="accept any server certificate"
    )
    t.add_argument("--prometheus-timeout", type=float, default=60.0, help="seconds per query (default 60)")


TSDB_FLAGS = {
    "step", "format", "prometheus", "instance", "node", "selector", "at", "span_from", "span_to",
    "time_scale", "prometheus_user", "prometheus_password_file", "prometheus_bearer_token_file",
    "prometheus_ca", "prometheus_cert", "prometheus_key", "prometheus_insecure_skip_verify",
    "prometheus_timeout",
}  # fmt: skip


def settings_from(args: argparse.Namespace) -> Settings:
    skip = ("command", "config", "json", "url", *TSDB_FLAGS)
    flags = {k: v for k, v in vars(args).items() if k not in skip}
    if flags.get("engines") is not None:
        flags["engines"] = tuple(flags["engines"])
    return load(flags, args.config)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = settings_from(args)
    except ConfigError as err:
        print(f"llm-gpu-exporter: invalid configuration: {err}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per engine scrape is noise
    if settings.simulate and settings.simulate not in builtin_names():
        print(
            f"llm-gpu-exporter: unknown scenario {settings.simulate!r}; known: {', '.join(builtin_names())}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        if args.command == "serve":
            return serve(settings)
        if args.command == "snapshot":
            return snapshot(settings, as_json=args.json)
        return diagnose(settings, args)
    except NvmlUnavailable as err:
        print(f"llm-gpu-exporter: {err}; {NO_DRIVER_HINT}", file=sys.stderr)
        return EXIT_NO_DRIVER
    except (ScenarioError, ConfigError) as err:
        print(f"llm-gpu-exporter: {err}", file=sys.stderr)
        return EXIT_USAGE


def serve(settings: Settings) -> int:
    import uvicorn

    from exporter import app, webconfig
    from exporter.server import create_app

    web = webconfig.load(settings.web_config_file) if settings.web_config_file else None
    exporter = app.build(settings)
    # Modules and the built exporter live as long as the process: keep them out of every
    # full collection, which otherwise holds the GIL for tens of ms at 72 GPUs.
    gc.collect()
    gc.freeze()
    exporter.runner.start()
    scheme = "https" if web is not None and web.tls else "http"
    shown = "localhost" if settings.host in ("0.0.0.0", "::") else settings.host
    source = f"simulated: {settings.simulate or settings.scenario_file}" if settings.simulated else "NVML"
    print(
        f"llm-gpu-exporter {__version__} serving {scheme}://{shown}:{settings.port}/ ({source})", flush=True
    )
    try:
        uvicorn.run(
            create_app(exporter.runner, web),
            host=settings.host,
            port=settings.port,
            log_level="warning",
            access_log=False,
            **(webconfig.uvicorn_options(web) if web else {}),
        )
    finally:
        exporter.close()
    return 0


def snapshot(settings: Settings, as_json: bool) -> int:
    from exporter import app
    from exporter.server import snapshot_json
    from exporter.table import render_table

    exporter = app.build(settings)
    try:
        exporter.runner.step()
        time.sleep(min(1.0, settings.interval))  # GPM compares two samples
        snap = exporter.runner.step().snapshot
    finally:
        exporter.close()
    print(json.dumps(snapshot_json(snap), indent=2, default=str) if as_json else render_table(snap))
    return 0


def diagnose(settings: Settings, args: argparse.Namespace) -> int:
    from exporter.diagnosis.report import exit_code, render_text

    if args.prometheus is not None:
        return diagnose_tsdb(args)
    data: dict[str, Any]
    if args.url is not None:
        import httpx

        url = args.url
        try:
            data = httpx.get(url.rstrip("/") + "/api/v1/diagnosis", timeout=10).raise_for_status().json()
        except httpx.HTTPError as err:
            print(f"llm-gpu-exporter: cannot read the diagnosis from {url}: {err}", file=sys.stderr)
            return EXIT_USAGE
    else:
        from exporter import app
        from exporter.diagnosis.routes import diagnosis_json
        from exporter.tsdb.timespec import TimeError, duration

        if settings.simulated:
            try:
                step = duration(args.step) if args.step is not None else 5.0
            except TimeError as err:
                print(f"llm-gpu-exporter: --step: {err}", file=sys.stderr)
                return EXIT_USAGE
            *_, last = app.simulate(settings, step_s=step)
        else:
            exporter = app.build(settings)
            try:
                last = exporter.runner.step().snapshot
            finally:
                exporter.close()
        found = diagnosis_json(last)
        if found is None:
            print("llm-gpu-exporter: no diagnosis was produced", file=sys.stderr)
            return EXIT_USAGE
        data = found
    print(json.dumps(data, indent=2) if args.format == "json" else render_text(data))
    return int(exit_code(data))


def diagnose_tsdb(args: argparse.Namespace) -> int:
    """`diagnose --prometheus URL`: the diagnosis rebuilt from stored series."""
    import os

    from exporter.diagnosis.report import exit_code
    from exporter.tsdb import output
    from exporter.tsdb.client import Connection, QueryApi, TsdbError
    from exporter.tsdb.replay import NoData, Request, Selection, UnknownNode, diagnose
    from exporter.tsdb.timespec import TimeError, duration, moment

    def fail(code: int, message: str) -> int:
        print(f"llm-gpu-exporter: {message}", file=sys.stderr)
        return code

    now = time.time()
    try:
        if args.at is not None and (args.span_from is not None or args.span_to is not None):
            return fail(EXIT_USAGE, "give --at or --from/--to, not both")
        if args.span_from is not None:
            end = moment(args.span_to, now) if args.span_to is not None else now
            start = moment(args.span_from, now)
        elif args.span_to is not None:
            return fail(EXIT_USAGE, "--to needs --from")
        else:
            start = end = moment(args.at, now) if args.at is not None else now
        step = duration(args.step) if args.step is not None else None
    except TimeError as err:
        return fail(EXIT_USAGE, str(err))
    if start > end:
        return fail(EXIT_USAGE, "--from is after --to")
    if (step is not None and step <= 0) or args.time_scale <= 0:
        return fail(EXIT_USAGE, "--step and --time-scale must be positive")
    if args.instance is not None and args.node is not None:
        return fail(EXIT_USAGE, "give --instance or --node, not both")
    try:
        password = None
        if args.prometheus_password_file:
            password = _read_secret(args.prometheus_password_file)
        elif args.prometheus_user is not None:
            password = os.environ.get(PASSWORD_ENV)
        token = _read_secret(args.prometheus_bearer_token_file) if args.prometheus_bearer_token_file else None
    except OSError as err:
        return fail(EXIT_USAGE, f"cannot read a credential file: {err}")
    conn = Connection(
        url=args.prometheus,
        user=args.prometheus_user,
        password=password,
        bearer_token=token,
        ca_file=args.prometheus_ca,
        cert_file=args.prometheus_cert,
        key_file=args.prometheus_key,
        insecure_skip_verify=args.prometheus_insecure_skip_verify,
        timeout_s=args.prometheus_timeout,
    )
    selection = Selection(args.instance, args.node, args.selector or "")
    req = Request(selection, start, end, step, args.time_scale)
    try:
        with QueryApi(conn) as api:
            results, silent = diagnose(api, req)
    except UnknownNode as err:
        known = "\n  ".join(str(k) for k in err.known)
        return fail(EXIT_UNKNOWN_NODE, f"{err}; nodes known then:\n  {known}")
    except NoData as err:
        return fail(EXIT_NO_DATA, f"{err} ({args.prometheus})")
    except TsdbError as err:
        return fail(EXIT_TSDB_UNREACHABLE, str(err))
    if selection.one_node:
        data = output.node_json(args.prometheus, req, results[0])
        text = output.node_text(data)
        code = int(exit_code(data))
    else:
        data = output.fleet_json(args.prometheus, req, results, silent)
        text = output.fleet_text(data)
        code = output.fleet_exit_code(data)
    print(json.dumps(data, indent=2) if args.format == "json" else text)
    return code


def _read_secret(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


if __name__ == "__main__":
    sys.exit(main())
