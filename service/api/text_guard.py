"""Text no name, id or key can hold is refused at the door, before a handler or PostgreSQL
meets it (each of these gave a 500 there):

- a NUL character in the URL's path or query (``/v1/jobs/%00``, ``?team=%00``): PostgreSQL
  text cannot hold one, so a lookup failed; answered 400 naming it;
- a lone UTF-16 surrogate in a JSON body (an escaped ``\\ud800`` without its partner): Python's
  json module accepts one, but it is not Unicode, and the error echo, PostgreSQL and the job's
  files each failed on it; answered 422 naming the field.

Body bytes are scanned as they arrive for the escape (``\\uD800`` to ``\\uDFFF``); only a body
that holds one is parsed here, once complete, to find the lone ones. A surrogate pair (an
escaped emoji) is valid and passes.
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.asgi import send_json

_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_ESCAPE_LEN = 4  # bytes of a partial escape that may end one chunk and go on in the next


class TextGuard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if where := _nul_in_url(scope):
            await send_json(send, 400, f"the URL's {where} holds a NUL character (%00)")
            return
        await _GuardedRequest(self.app, scope, receive, send).run()


def _nul_in_url(scope: Scope) -> str | None:
    if "\x00" in scope["path"]:  # the server has decoded %00 in the path already
        return "path"
    query: bytes = scope.get("query_string", b"")
    if b"\x00" in query or b"%00" in query:
        return "query"
    return None


class _GuardedRequest:
    def __init__(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        self.app, self.scope, self._receive, self._send = app, scope, receive, send
        self.chunks: list[bytes] = []  # the app holds them too; bounded by BodyLimit
        self.suspect = False
        self.refused = False

    async def run(self) -> None:
        await self.app(self.scope, self.receive, self.send)

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] != "http.request":
            return message
        body = message.get("body", b"")
        if not self.suspect:
            before = self.chunks[-1][-_ESCAPE_LEN:] if self.chunks else b""
            self.suspect = _ESCAPE.search(before + body) is not None
        self.chunks.append(body)
        if self.suspect and not message.get("more_body", False):
            where = lone_surrogate_at(b"".join(self.chunks))
            if where is not None:
                self.refused = True
                await self._refuse(where)
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if not self.refused:  # after a refusal, the app's own answer is dropped for ours
            await self._send(message)

    async def _refuse(self, where: list[str | int]) -> None:
        detail = [
            {
                "loc": ["body", *where],
                "msg": "holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), "
                "which is not Unicode",
                "type": "value_error",
            }
        ]
        await send_json(self._send, 422, detail)


def lone_surrogate_at(body: bytes) -> list[str | int] | None:
    """Where the first string (key or value) with a lone surrogate is, or None. A body that is
    not JSON is left to the app, which names that problem."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return _find(value, [])


def _find(value: Any, path: list[str | int]) -> list[str | int] | None:
    # An explicit stack: a deeply nested body must not exhaust the interpreter's recursion.
    stack: list[tuple[Any, list[str | int]]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if not _is_unicode(item):
                return where
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                if not _is_unicode(key):
                    return [*where, key.encode("utf-8", "backslashreplace").decode()]
                stack.append((child, [*where, key]))
        elif isinstance(item, list):
            stack.extend((child, [*where, i]) for i, child in reversed(list(enumerate(item))))
    return None


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
