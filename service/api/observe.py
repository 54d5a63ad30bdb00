"""Per-request observation: a request id that follows the work into the workers, and timing.

The id comes from the caller's ``X-Request-ID`` when it is a plain token, else a new one; it is
returned in the response, set on every log record of the request, and put in the header of the
Celery messages the request sends, so the worker's log lines for that launch carry it too.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from fastapi import FastAPI
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import logs
from service.metrics import HTTP_REQUESTS

_VALID_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def install(app: FastAPI) -> None:
    app.add_middleware(Observe)
    _send_request_id_with_tasks()


class Observe:
    """Plain ASGI, not ``BaseHTTPMiddleware``: that one adds a task and a stream per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _VALID_ID.match(given) else uuid.uuid4().hex
        started = time.perf_counter()
        status = 500  # what the client gets if the app raises before answering

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["X-Request-ID"] = rid
            await send(message)

        token = logs.request_id.set(rid)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            logs.request_id.reset(token)
            route = scope.get("route")
            template = getattr(route, "path", "unmatched")  # the template keeps label values few
            HTTP_REQUESTS.labels(scope["method"], template, str(status)).observe(
                time.perf_counter() - started
            )


def _send_request_id_with_tasks() -> None:
    from celery import signals

    signals.before_task_publish.connect(_add_request_id, weak=False)


def _add_request_id(headers: dict[str, Any] | None = None, **_: Any) -> None:
    rid = logs.request_id.get()
    if rid and headers is not None:
        headers[logs.REQUEST_ID_HEADER] = rid
