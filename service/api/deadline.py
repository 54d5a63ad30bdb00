"""No request outlives ``api.request_deadline_s``: past it the client gets 504 naming the
deadline. A handler running in a worker thread cannot be stopped from outside; its work is
bounded by the limits in ``service.core.limits``, and the deadline bounds the client's wait."""

from __future__ import annotations

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.asgi import send_json


def past_deadline_message(seconds: float) -> str:
    return f"the request ran past its deadline of {seconds:g} s (setting api.request_deadline_s)"


class Deadline:
    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        with anyio.move_on_after(self.seconds) as timer:
            await self.app(scope, receive, tracked_send)
        if timer.cancelled_caught and not started:
            await send_json(send, 504, past_deadline_message(self.seconds))
