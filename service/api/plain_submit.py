"""``POST /v1/jobs`` for a well-formed request, without FastAPI's per-request machinery.

The FastAPI route (``routes.jobs.create_job``) is the contract: OpenAPI, and every refusal of
the request's form (a body that is not a JobSpec, a bad Idempotency-Key) in its 422 wording.
This route sits before it and serves the requests it can read as they are: a JSON body that
validates as a ``JobSpec`` and a key that matches the header's rule. Anything else is handed to
the FastAPI route with the body it read, so no request is answered differently. What it skips
is the dependency solving, the parse of the body into Python objects before validation and
the route's wrappers: 0.3-1.4 ms of the 3.9-5.1 ms of API CPU a submit took, in six measured
pairs (``docs/benchmarks.md``, fifth pass).
"""

from __future__ import annotations

import re

from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import ValidationError
from sqlmodel import Session
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from service.api.deps import bearer, get_settings
from service.api.submitting import (
    IDEMPOTENCY_KEY_MAX,
    IDEMPOTENCY_KEY_PATTERN,
    as_http,
    submit,
)
from service.core.spec import JobSpec
from service.db.session import get_engine
from service.settings import Settings
from service.submit import Forbidden, Unauthorised, submitter

_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)


def plain_submit_route(contract: APIRoute) -> Route:
    """A route for ``contract``'s path and method that serves well-formed submits itself."""
    return Route(contract.path, PlainSubmit(contract), methods=["POST"], name="plain_submit")


class PlainSubmit:
    def __init__(self, contract: APIRoute) -> None:
        self.contract = contract

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            body = await request.body()
        except ClientDisconnect:  # the client went away (or BodyLimit cut it off: its 413)
            return
        spec = _plain_spec(request, body)
        key = request.headers.get("idempotency-key")
        settings = await get_settings(request)
        credentials = await bearer(request)
        if spec is None or (key is not None and not _plain_key(key)):
            # Who asks comes before what is wrong with the request: no 422 to a stranger.
            refusal = await run_in_threadpool(_refusal_of_caller, settings, credentials)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
            await self.contract.handle(scope, _replay(body, receive), send)
            return
        response = await run_in_threadpool(submit, spec, credentials, settings, key)
        await response(scope, receive, send)


def _refusal_of_caller(
    settings: Settings, credentials: HTTPAuthorizationCredentials | None
) -> Response | None:
    """The 401 or 403 a submit with these credentials gets, or None when they may submit."""
    token = credentials.credentials if credentials is not None else None
    with Session(get_engine(settings.database_url)) as session:
        try:
            submitter(session, token)
        except (Unauthorised, Forbidden) as refused:
            exc = as_http(refused)
            return JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)
    return None


def _plain_spec(request: Request, body: bytes) -> JobSpec | None:
    """The spec, if the body is JSON declared as such and valid; else None (the contract's)."""
    if request.headers.get("content-type") != "application/json":
        return None
    try:
        return JobSpec.model_validate_json(body)
    except ValidationError:
        return None


def _plain_key(key: str) -> bool:
    return len(key) <= IDEMPOTENCY_KEY_MAX and _KEY.fullmatch(key) is not None


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for the contract: the body already read, then the client's own messages."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
