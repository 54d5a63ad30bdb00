"""A request body over ``api.max_request_bytes`` is answered 413 naming the limit, whether the
client declared its length or sends it in chunks: bytes are counted as they arrive, and the
request is cut off at the first chunk past the limit, so nothing larger is ever held."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.asgi import send_json


def too_large_message(limit: int) -> str:
    return (
        f"the request body is over the limit of {limit} bytes ({limit / 2**20:.2f} MiB, "
        "setting api.max_request_bytes)"
    )


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        await _CountedRequest(self, scope, receive, send).run()

    async def _refuse(self, send: Send) -> None:
        close = [(b"connection", b"close")]
        await send_json(send, 413, too_large_message(self.max_bytes), close)


class _CountedRequest:
    """One request whose body is counted; past the limit the app reads a disconnect and
    whatever it then answers is dropped for our 413."""

    def __init__(self, limit: BodyLimit, scope: Scope, receive: Receive, send: Send) -> None:
        self.limit, self.scope, self._receive, self._send = limit, scope, receive, send
        self.received = 0
        self.started = False  # the app's answer began: too late for a 413
        self.refused = False

    async def run(self) -> None:
        await self.limit.app(self.scope, self.receive, self.send)

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit.max_bytes:
                self.refused = True
                if not self.started:
                    await self.limit._refuse(self._send)
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        self.started = True
        await self._send(message)
