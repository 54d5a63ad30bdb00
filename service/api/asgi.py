"""What the plain ASGI middlewares share: answering a request themselves, in JSON."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Send


async def send_json(
    send: Send, status: int, detail: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Answer ``{"detail": detail}`` with ``status``, as the app's own errors read."""
    body = json.dumps({"detail": detail}).encode()
    start = [(b"content-type", b"application/json"), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})
