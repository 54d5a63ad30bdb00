"""422 answers that read like the README: the field and the rule, without pydantic's prefixes."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from service.core.messages import plain_message


def plain_errors(errors: Any) -> list[dict[str, Any]]:
    """FastAPI's error list with each ``msg`` as the validator wrote it."""
    return [{**e, "msg": plain_message(str(e.get("msg", "")))} for e in errors]


async def validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    detail = jsonable_encoder(plain_errors(exc.errors()))
    return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
