"""Command line: `serve`, `snapshot`, `diagnose`, `selfcheck` and `healthcheck`."""

from __future__ import annotations

import argparse
import errno
import gc
import json
import logging
import socket
import sys
import time
from typing import Any

from exporter import __version__
from exporter.config import NUMBERS, ConfigError, Settings, flag_of, load, range_text, unknown_variables
from exporter.nvml import NvmlUnavailable
from exporter.sim.scenario import ScenarioError, builtin_names

# Exit codes, one meaning each (README "Exit codes").
EXIT_OK = 0
EXIT_FINDINGS = 1  # diagnose: findings are active; selfcheck: a check failed
EXIT_UNHEALTHY = 1  # healthcheck: Docker reads 0 and 1 only (it reserves 2)
EXIT_USAGE = 2  # a bad flag, setting, config file or scenario
EXIT_NO_DRIVER = 3  # no NVIDIA driver (and no --simulate)
EXIT_ADDRESS = 4  # serve: the address is in use or not ours to take
EXIT_TSDB_UNREACHABLE = 5  # diagnose --prometheus: the query API cannot be used
EXIT_UNKNOWN_NODE = 6  # diagnose --prometheus: no such instance or node in the TSDB
EXIT_NO_DATA = 7  # diagnose --prometheus: the span holds no data
PASSWORD_ENV = "LLMGPU_PROMETHEUS_PASSWORD"
NO_DRIVER_HINT = "try `llm-gpu-exporter serve --simulate healthy` for a demo on simulated GPUs"


def _add_settings(p: argparse.ArgumentParser) -> None:
    """A flag for every setting, from its declaration in exporter.config.Settings."""
    p.add_argument("--config", metavar="FILE", help="YAML settings file (keys are the setting names)")
    for name, f in Settings.model_fields.items():
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        flag = flag_of(name)
        kwargs: dict[str, Any] = {"dest": name, "default": None}
        if f.annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif getattr(f.annotation, "__origin__", None) is tuple:
            kwargs["action"] = "append"
        if extra.get("metavar"):
            kwargs["metavar"] = str(extra["metavar"])
        default = f.default if f.default not in (None, ()) else None
        shown = [f"default {default}"] if default is not None and f.annotation is not bool else []
        shown += [range_text(name)] if name in NUMBERS else []
        shown_text = f" ({', '.join(shown)})" if shown else ""
        kwargs["help"] = f"{f.description}{shown_text}; LLMGPU_{name.upper()}".replace("%", "%%")
        p.add_argument(flag, **kwargs)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="llm-gpu-exporter",
        description="GPU + LLM-engine exporter that explains itself.",
        allow_abbrev=False,
    )
    top.add_argument("--version", action="version", version=__version__)
    sub = top.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, allow_abbrev=False)

    serve = command("serve", "serve /metrics, the diagnosis page and the JSON API")
    _add_settings(serve)

    health = command("healthcheck", "exit 0 when the exporter on this host answers /healthz, else 1")
    health.add_argument("--config", help="YAML settings file, as given to serve")
    health.add_argument("--listen", help="HOST:PORT the exporter serves on, as given to serve")
    health.add_argument("--web-config-file", help="the web config given to serve (for https)")
    health.add_argument(
        "--pid",
        dest="serve_pid",
        type=int,
        help="take --listen, --web-config-file and --config from the command line of this "
        "`serve` process (1 in the container image)",
    )
    health.add_argument(
        "--timeout", dest="probe_timeout", type=float, default=4.0, help="seconds (default 4)"
    )

    snap = command("snapshot", "print one sample as tables: GPUs, engines and their join")
    _add_settings(snap)
    snap.add_argument("--json", action="store_true", help="print the snapshot as JSON")

    diag = command("diagnose", "report what slows the node down or puts it at OOM risk")
    _add_settings(diag)
    diag.add_argument("--url", help="ask a running exporter (http://host:port) instead of sampling here")
    diag.add_argument(
        "--step",
        help="seconds per step: scenario seconds with --simulate (default 5), the query step with "
        "--prometheus (default: the scrape interval)",
    )
    diag.add_argument("--format", choices=("text", "json"), default="text", help="report format")
    _tsdb_flags(diag)

    check = command("selfcheck", "compare the exporter's readings with nvidia-smi's on this node")
    _add_settings(check)
    check.add_argument(
        "--nvidia-smi", default="nvidia-smi", metavar="PATH", help="nvidia-smi to compare with"
    )
    check.add_argument(
        "--smi-timeout", type=float, default=20.0, help="seconds nvidia-smi may take (default 20)"
    )
    check.add_argument(
        "--xid-seconds", type=float, default=3.0, help="seconds to listen for XID events (default 3)"
    )
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


def settings_from(args: argparse.Namespace) -> Settings:
    given = vars(args)
    return load({name: given[name] for name in Settings.model_fields if name in given}, args.config)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "healthcheck":
        return healthcheck(args)
    try:
        settings = settings_from(args)
    except ConfigError as err:
        print(f"llm-gpu-exporter: invalid configuration: {err}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per engine scrape is noise
    for line in unknown_variables():  # a typo is seen; an unrelated variable stops nothing
        logging.getLogger("exporter.config").warning("%s", line)
    if settings.simulate and settings.simulate not in builtin_names():
        print(
            f"llm-gpu-exporter: setting 'simulate': unknown scenario {settings.simulate!r}; "
            f"known: {', '.join(builtin_names())}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        if args.command == "serve":
            return serve(settings)
        if args.command == "snapshot":
            return snapshot(settings, as_json=args.json)
        if args.command == "selfcheck":
            from exporter import selfcheck

            return selfcheck.main(settings, args.nvidia_smi, args.smi_timeout, args.xid_seconds)
        return diagnose(settings, args)
    except NvmlUnavailable as err:
        print(f"llm-gpu-exporter: {err}; {NO_DRIVER_HINT}", file=sys.stderr)
        return EXIT_NO_DRIVER
    except (ScenarioError, ConfigError) as err:
        print(f"llm-gpu-exporter: {err}", file=sys.stderr)
        return EXIT_USAGE


def serve(settings: Settings) -> int:
    from exporter import app
    from exporter.web import webconfig
    from exporter.web.limits import ServerLimits, build_server
    from exporter.web.server import create_app

    web = webconfig.load(settings.web_config_file) if settings.web_config_file else None
    try:
        listener = _bind(settings.host, settings.port)
    except OSError as err:
        reason = "is in use" if err.errno == errno.EADDRINUSE else f"cannot be used: {err.strerror or err}"
        print(f"llm-gpu-exporter: {settings.listen} {reason}; choose another with --listen", file=sys.stderr)
        return EXIT_ADDRESS
    limits = ServerLimits(
        max_connections=settings.max_connections,
        idle_timeout=settings.idle_timeout,
        header_timeout=settings.header_timeout,
        write_timeout=settings.write_timeout,
    )
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
        build_server(
            create_app(exporter.runner, web),
            settings.host,
            settings.port,
            limits,
            ssl_context=webconfig.ssl_context(web) if web else None,
            connect_state=webconfig.connect_state(web) if web and web.tls else None,
        ).run(sockets=[listener])
    finally:
        exporter.close()
    return EXIT_OK


def _bind(host: str, port: int) -> socket.socket:
    """The server's socket, bound before anything starts so that a busy port is one clear
    line. It listens only once the server starts: until then a connection is refused, not
    left waiting in a backlog nobody serves (a scrape would time out instead of failing)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _serve_flags(pid: int) -> argparse.Namespace | None:
    """The flags of a running `serve`, read from its command line; None if it is not one."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode() for a in f.read().split(b"\0") if a]
    except OSError:
        return None
    if "serve" not in argv:
        return None
    try:
        return parser().parse_args(argv[argv.index("serve") :])
    except SystemExit:
        return None


def healthcheck(args: argparse.Namespace) -> int:
    """GET /healthz where `serve` listens, over https when its web config has TLS.

    The certificate is not verified: this is a liveness probe over loopback, and the
    server's certificate is seldom issued for 127.0.0.1. /healthz needs no credentials.
    """
    import http.client
    import ssl

    from exporter.web import webconfig

    given = {k: getattr(args, k) for k in ("listen", "web_config_file")}
    config = args.config
    served = _serve_flags(args.serve_pid) if args.serve_pid else None
    if served is not None:  # the serve process's flags win, as they do for it
        given = {k: getattr(served, k) or v for k, v in given.items()}
        config = served.config or config
    try:
        settings = load(given, config)
        web = webconfig.load(settings.web_config_file) if settings.web_config_file else None
    except ConfigError as err:
        print(f"llm-gpu-exporter healthcheck: invalid configuration: {err}", file=sys.stderr)
        return EXIT_UNHEALTHY
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(settings.host, settings.host)
    conn: http.client.HTTPConnection
    if web is not None and web.tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection(host, settings.port, timeout=args.probe_timeout, context=context)
    else:
        conn = http.client.HTTPConnection(host, settings.port, timeout=args.probe_timeout)
    scheme = "https" if web is not None and web.tls else "http"
    try:
        conn.request("GET", "/healthz")
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as err:
        print(
            f"llm-gpu-exporter healthcheck: {scheme}://{host}:{settings.port}/healthz: {err}", file=sys.stderr
        )
        return EXIT_UNHEALTHY
    finally:
        conn.close()
    if status != 200:
        print(f"llm-gpu-exporter healthcheck: /healthz answered {status}", file=sys.stderr)
        return EXIT_UNHEALTHY
    return 0


def snapshot(settings: Settings, as_json: bool) -> int:
    from exporter import app
    from exporter.table import render_table
    from exporter.web.server import snapshot_json

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
        from exporter.tsdb.timespec import TimeError, duration
        from exporter.web.routes import diagnosis_json

        if settings.simulated:
            try:
                step = duration(args.step) if args.step is not None else 5.0
            except TimeError as err:
                print(f"llm-gpu-exporter: --step: {err}", file=sys.stderr)
                return EXIT_USAGE
            from exporter.sim import node

            *_, last = node.play(settings, step_s=step)
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
