"""Command line: `serve`, `snapshot`, `diagnose`, `selfcheck` and `healthcheck`."""

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
SELFCHECK_FLAGS = ("nvidia_smi", "smi_timeout", "xid_seconds")
EXIT_UNHEALTHY = 1  # Docker reserves 2: a healthcheck answers 0 or 1 only
NO_DRIVER_HINT = "try `llm-gpu-exporter serve --simulate healthy` for a demo on simulated GPUs"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML settings file (keys as below, snake_case)")
    sim = p.add_mutually_exclusive_group()
    sim.add_argument(
        "--simulate", metavar="NAME", help="run on simulated GPUs and engines: a built-in scenario"
    )
    sim.add_argument("--scenario-file", metavar="FILE", help="run a scenario from a YAML file")
    p.add_argument(
        "--speed", type=float, help="scenario seconds per wall second (default 10; 1 plays in real time)"
    )
    p.add_argument("--interval", type=float, help="seconds between snapshots (default 1)")
    p.add_argument(
        "--engine",
        dest="engines",
        action="append",
        metavar="URL",
        help="an inference engine's /metrics URL, optionally TYPE=URL (repeatable)",
    )
    p.add_argument("--log-level", help="debug, info, warning or error")
    p.add_argument(
        "--gpu-hour-price",
        type=float,
        help="price of one GPU-hour, for cost per million tokens (any currency)",
    )


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
    _limits(serve)
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

    health = sub.add_parser(
        "healthcheck", help="exit 0 when the exporter on this host answers /healthz, else 1"
    )
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

    snap = sub.add_parser("snapshot", help="print one sample as a table")
    _common(snap)
    snap.add_argument("--json", action="store_true", help="print the snapshot as JSON")

    diag = sub.add_parser("diagnose", help="report what slows the node down or puts it at OOM risk")
    _common(diag)
    diag.add_argument("--url", help="ask a running exporter (http://host:port) instead of sampling here")
    diag.add_argument("--step", type=float, default=5.0, help="scenario seconds per step with --simulate")
    check = sub.add_parser("selfcheck", help="compare the exporter's readings with nvidia-smi's on this node")
    _common(check)
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


def _limits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-connections", type=int, help="open connections at most (default 1024)")
    p.add_argument("--idle-timeout", type=float, help="s a connection may sit without a request (default 5)")
    p.add_argument("--header-timeout", type=float, help="s for a request's headers to arrive (default 10)")
    p.add_argument("--write-timeout", type=float, help="s for a response to be read (default 30)")
    p.add_argument("--engine-max-labels", type=int, help="labels per engine series (default 64)")
    p.add_argument(
        "--engine-max-label-length", type=int, help="characters per engine label value (default 2048)"
    )


def settings_from(args: argparse.Namespace) -> Settings:
    flags = {
        k: v
        for k, v in vars(args).items()
        if k not in ("command", "config", "json", "url", "step", *SELFCHECK_FLAGS)
    }
    if flags.get("engines") is not None:
        flags["engines"] = tuple(flags["engines"])
    return load(flags, args.config)


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
        if args.command == "selfcheck":
            from exporter import selfcheck

            return selfcheck.main(settings, args.nvidia_smi, args.smi_timeout, args.xid_seconds)
        return diagnose(settings, url=args.url, step=args.step)
    except NvmlUnavailable as err:
        print(f"llm-gpu-exporter: {err}; {NO_DRIVER_HINT}", file=sys.stderr)
        return EXIT_NO_DRIVER
    except (ScenarioError, ConfigError) as err:
        print(f"llm-gpu-exporter: {err}", file=sys.stderr)
        return EXIT_USAGE


def serve(settings: Settings) -> int:
    from exporter import app, webconfig
    from exporter.http_limits import ServerLimits, build_server
    from exporter.server import create_app

    web = webconfig.load(settings.web_config_file) if settings.web_config_file else None
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
        ).run()
    finally:
        exporter.close()
    return 0


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

    from exporter import webconfig

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


def diagnose(settings: Settings, url: str | None, step: float) -> int:
    from exporter.diagnosis.report import exit_code, render_text

    data: dict[str, Any]
    if url is not None:
        import httpx

        try:
            data = httpx.get(url.rstrip("/") + "/api/v1/diagnosis", timeout=10).raise_for_status().json()
        except httpx.HTTPError as err:
            print(f"llm-gpu-exporter: cannot read the diagnosis from {url}: {err}", file=sys.stderr)
            return EXIT_USAGE
    else:
        from exporter import app
        from exporter.diagnosis.routes import diagnosis_json

        if settings.simulated:
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
    print(render_text(data))
    return int(exit_code(data))


if __name__ == "__main__":
    sys.exit(main())
