"""HTTP routes of the diagnosis: the page at / and its JSON at /api/v1/diagnosis.

Both are rendered once per snapshot, on the first request for it (exporter.web.per_snapshot),
so a client polling them as fast as it can costs a lookup per request, not a render.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from exporter.diagnosis.model import Diagnosis
from exporter.snapshot import Simulation, Snapshot
from exporter.web.page import render_page
from exporter.web.per_snapshot import PerSnapshot

NO_STORE = {"Cache-Control": "no-store"}
HTML = "text/html; charset=utf-8"
STARTING = json.dumps({"status": "starting", "detail": "no diagnosed snapshot yet"}).encode()


def diagnosis_json(snapshot: Snapshot | None) -> dict[str, Any] | None:
    """The JSON of the snapshot's diagnosis; None before the first one."""
    if snapshot is None:
        return None
    diagnosis = snapshot.get(Diagnosis)
    if diagnosis is None:
        return None
    data = diagnosis.to_json()
    simulation = snapshot.get(Simulation)
    if simulation is not None:  # a demo says what it plays, on the scenario's own clock
        data["simulation"] = simulation.to_json()
    return data


def _json_bytes(snapshot: Snapshot) -> bytes | None:
    data = diagnosis_json(snapshot)
    return (
        None
        if data is None
        else json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    )


def _page_bytes(snapshot: Snapshot) -> bytes:
    return render_page(diagnosis_json(snapshot)).encode()


class DiagnosisBytes:
    """The diagnosis of the latest snapshot as JSON and as the page, made once each."""

    def __init__(self) -> None:
        self.json = PerSnapshot(_json_bytes)
        self.page = PerSnapshot(_page_bytes)


def router(current: Callable[[], Snapshot | None], cache: DiagnosisBytes | None = None) -> APIRouter:
    """`current` returns the latest published snapshot (None before the first)."""
    api = APIRouter()
    made = cache or DiagnosisBytes()

    @api.get("/", include_in_schema=False)
    async def page() -> Response:
        snapshot = current()
        body = render_page(None).encode() if snapshot is None else await made.page.get(snapshot)
        return Response(body, media_type=HTML, headers=NO_STORE)

    @api.get("/api/v1/diagnosis")
    async def diagnosis() -> Response:
        snapshot = current()
        body = None if snapshot is None else await made.json.get(snapshot)
        if body is None:
            return Response(
                STARTING, status_code=503, media_type="application/json", headers={"Retry-After": "2"}
            )
        return Response(body, media_type="application/json", headers=NO_STORE)

    return api
