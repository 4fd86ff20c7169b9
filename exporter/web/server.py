"""The HTTP side: serves what the runner last published; never touches NVML or an engine."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from exporter import __version__
from exporter.runner import Runner
from exporter.snapshot import Snapshot
from exporter.web.exposition import OPENMETRICS, TEXT
from exporter.web.per_snapshot import PerSnapshot
from exporter.web.routes import DiagnosisBytes
from exporter.web.routes import router as diagnosis_router
from exporter.web.webconfig import AuthMiddleware, HeadersMiddleware, WebConfig


def snapshot_json(snapshot: Snapshot) -> dict[str, Any]:
    """The snapshot as plain JSON: every reading under its class name."""

    def readings(items: Any) -> dict[str, Any]:
        return {type(r).__name__: _asdict(r) for r in items}

    return {
        "taken_at": snapshot.taken_at,
        "simulated": snapshot.simulated,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "up": g.up,
                "supported": dict(g.supported),
                "attribution": dict(g.attribution),
                "readings": readings(g.readings.values()),
            }
            for g in snapshot.gpus
        ],
        "node": {cls.__name__: [_asdict(r) for r in items] for cls, items in snapshot.node.items()},
        "collectors": [dataclasses.asdict(c) for c in snapshot.collectors],
    }


def _asdict(reading: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(reading) and not isinstance(reading, type):
        return dataclasses.asdict(reading)
    return {"value": repr(reading)}


def _snapshot_bytes(snapshot: Snapshot) -> bytes:
    return json.dumps(snapshot_json(snapshot), default=str).encode()


def create_app(
    runner: Runner, web: WebConfig | None = None, diagnosis: DiagnosisBytes | None = None
) -> FastAPI:
    """The routes; every one answers from bytes made before it or once per snapshot.

    The handlers are coroutines: none of them blocks (renders go to a thread), so a
    request costs no thread-pool hop.
    """
    app = FastAPI(title="llm-gpu-exporter", version=__version__, docs_url=None, redoc_url=None)
    snapshot_bytes = PerSnapshot(_snapshot_bytes)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        rendered = runner.published
        if rendered is None:
            return PlainTextResponse("no sample yet\n", status_code=503)
        runner.stats.scrapes += 1
        gzip_ok = "gzip" in request.headers.get("accept-encoding", "")
        openmetrics = "application/openmetrics-text" in request.headers.get("accept", "")
        key = ("openmetrics" if openmetrics else "text") + ("_gzip" if gzip_ok else "")
        runner.cadence.seen(request.client.host if request.client else "", key, time.monotonic())
        headers = {"content-type": OPENMETRICS if openmetrics else TEXT, "vary": "accept, accept-encoding"}
        if gzip_ok:
            headers["content-encoding"] = "gzip"
        return Response(rendered.get(key), headers=headers)

    @app.get("/healthz")
    async def healthz() -> PlainTextResponse:
        # Liveness: 503 once a thread that collects or publishes has ended, or publishing
        # keeps failing; nothing short of a restart brings them back (/readyz says stale).
        reasons = runner.health()
        if reasons:
            return PlainTextResponse("".join(f"{r}\n" for r in reasons), status_code=503)
        return PlainTextResponse("ok\n")

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        rendered = runner.published
        age = None if rendered is None else time.monotonic() - rendered.rendered_at
        ready = age is not None and age <= max(3 * runner.interval, 5.0)
        body = {
            "ready": ready,
            "sample_age_seconds": age,
            "gpus": []
            if rendered is None
            else [{"index": g.index, "uuid": g.uuid, "up": g.up} for g in rendered.snapshot.gpus],
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/api/v1/snapshot")
    async def snapshot() -> Response:
        rendered = runner.published
        if rendered is None:
            return JSONResponse({"error": "no sample yet"}, status_code=503)
        return Response(await snapshot_bytes.get(rendered.snapshot), media_type="application/json")

    app.include_router(
        diagnosis_router(lambda: runner.published.snapshot if runner.published else None, diagnosis)
    )

    if web is not None and web.checks_requests:

        def count(reason: str) -> None:
            runner.stats.auth_failures[reason] += 1

        app.add_middleware(AuthMiddleware, cfg=web, on_failure=count)
    if web is not None and web.headers:
        app.add_middleware(HeadersMiddleware, headers=web.headers)  # outermost: on 401s too
    return app
