"""Per-request observation: a request id that follows the work into the workers, and timing.

The id comes from the caller's ``X-Request-ID`` when it is a plain token, else a new one; it is
returned in the response, set on every log record of the request, and put in the header of the
Celery messages the request sends, so the worker's log lines for that launch carry it too.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response

from service import logs
from service.metrics import HTTP_REQUESTS

_VALID_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
Handler = Callable[[Request], Awaitable[Response]]


def install(app: FastAPI) -> None:
    app.middleware("http")(_observe)
    _send_request_id_with_tasks()


async def _observe(request: Request, call_next: Handler) -> Response:
    given = request.headers.get("x-request-id", "")
    rid = given if _VALID_ID.match(given) else uuid.uuid4().hex
    started = time.perf_counter()
    token = logs.request_id.set(rid)
    try:
        response = await call_next(request)
    finally:
        logs.request_id.reset(token)
    route = request.scope.get("route")
    template = getattr(route, "path", "unmatched")  # the template keeps label values few
    HTTP_REQUESTS.labels(request.method, template, str(response.status_code)).observe(
        time.perf_counter() - started
    )
    response.headers["X-Request-ID"] = rid
    return response


def _send_request_id_with_tasks() -> None:
    from celery import signals

    signals.before_task_publish.connect(_add_request_id, weak=False)


def _add_request_id(headers: dict[str, Any] | None = None, **_: Any) -> None:
    rid = logs.request_id.get()
    if rid and headers is not None:
        headers[logs.REQUEST_ID_HEADER] = rid
