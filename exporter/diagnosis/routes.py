"""HTTP routes of the diagnosis: the page at / and its JSON at /api/v1/diagnosis."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse

from exporter.diagnosis.model import Diagnosis
from exporter.diagnosis.page import render_page
from exporter.snapshot import Snapshot


def diagnosis_json(snapshot: Snapshot | None) -> dict[str, Any] | None:
    """The JSON of the snapshot's diagnosis; None before the first one."""
    if snapshot is None:
        return None
    diagnosis = snapshot.get(Diagnosis)
    return diagnosis.to_json() if diagnosis is not None else None


def router(current: Callable[[], Snapshot | None]) -> APIRouter:
    """`current` returns the latest published snapshot (None before the first)."""
    api = APIRouter()

    @api.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        data = diagnosis_json(current())
        return HTMLResponse(render_page(data), status_code=200, headers={"Cache-Control": "no-store"})

    @api.get("/api/v1/diagnosis")
    def diagnosis() -> JSONResponse:
        data = diagnosis_json(current())
        if data is None:
            return JSONResponse(
                {"status": "starting", "detail": "no diagnosed snapshot yet"},
                status_code=503,
                headers={"Retry-After": "2"},
            )
        return JSONResponse(data, headers={"Cache-Control": "no-store"})

    return api
