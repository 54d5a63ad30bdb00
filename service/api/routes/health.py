"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import text

from service.api.deps import SessionDep, SettingsDep
from service.db.migrate import is_at_head

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


class Readiness(BaseModel):
    status: str  # ready | unavailable
    reason: str | None = None


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Not ready, and why"}},
)
def readyz(session: SessionDep, settings: SettingsDep) -> JSONResponse:
    """The database answers and its schema is at the latest migration."""
    try:
        session.execute(text("SELECT 1"))
        migrated = is_at_head(settings.database_url)
    except Exception as exc:  # any database failure means "not ready", with the reason
        return JSONResponse({"status": "unavailable", "reason": str(exc)[:300]}, status_code=503)
    if not migrated:
        reason = "database schema is not at the latest migration (run: zeropilot migrate)"
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)
    return JSONResponse({"status": "ready"})
