"""Errors as a client can act on them: 422 answers that read like the README (the field and
the rule, without pydantic's prefixes), and 503 with Retry-After while the database is away."""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import InterfaceError, OperationalError

from service.core.messages import plain_message

ECHO_LIMIT = 200  # characters of a refused input echoed back


def plain_errors(errors: Any) -> list[dict[str, Any]]:
    """FastAPI's error list with each ``msg`` as the validator wrote it, and the refused
    input echoed only when it is short and valid JSON (not a megabyte, not NaN)."""
    return [
        {**e, "msg": plain_message(str(e.get("msg", ""))), "input": short_input(e.get("input"))}
        for e in errors
    ]


def short_input(value: Any) -> Any:
    if value is None or (isinstance(value, bool | int) and abs(value) < 2**63):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, str) and len(value) <= ECHO_LIMIT:
        return value
    text = repr(value)
    return text if len(text) <= ECHO_LIMIT else text[:ECHO_LIMIT] + "..."


def body_field_error(field: str, why: str, value: Any) -> RequestValidationError:
    """A 422 about one field of the body, shaped as pydantic's own refusals are."""
    return RequestValidationError(
        [{"loc": ("body", field), "msg": why, "type": "value_error", "input": value}]
    )


async def validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    detail = jsonable_encoder(plain_errors(exc.errors()))
    return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


DATABASE_RETRY_AFTER_S = 5


async def database_unavailable(_: Request, exc: Exception) -> JSONResponse:
    """A lost connection is the operator's outage, not the client's error: retry later."""
    return JSONResponse(
        {"detail": f"the database is unavailable ({type(exc.__cause__ or exc).__name__}); retry"},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
    )


class ErrorPublic(BaseModel):
    """A refusal: one sentence, or (422) the fields with the rule each one broke."""

    detail: str | list[dict[str, Any]]


WHY = {
    400: "The body could not be read as JSON",
    401: "No bearer token, or not a known one",
    403: "The token's user may not do this",
    404: "No such resource in your team",
    409: "Conflicts with the resource's state",
    413: "The request body is over the size limit",
    503: "The database is unavailable: retry after Retry-After seconds",
    504: "The request ran past the deadline",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the errors a route may answer, so clients (and fuzzers) know them."""
    return {code: {"model": ErrorPublic, "description": WHY[code]} for code in codes}


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
    for lost in (OperationalError, InterfaceError):
        app.add_exception_handler(lost, database_unavailable)
