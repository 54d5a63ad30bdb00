"""uvicorn's httptools protocol with the limits it lacks, so that no client, logged in or not,
can hold the API's memory or its connections.

uvicorn bounds a request head only on its h11 protocol (``h11_max_incomplete_event_size``); on
httptools, which it picks when installed (as here), headers are unbounded: 100,000 headers and
a 50 MiB header were accepted, and httptools joins a header's pieces as they arrive, so a big
one also costs time. Its keep-alive timeout closes a connection idle *between* requests, never
one that has sent part of a head, and ``limit_concurrency`` answers 503 only once a head is
complete, so connections that never finish theirs were held for ever. Here, per connection:

- the head (request line and headers) may hold ``api.max_header_bytes`` and
  ``api.max_header_count`` headers: past either, 431 naming the limit, and the connection is
  closed. Bytes are counted as they arrive, so a head that never ends is cut at the limit plus
  one read, whatever its fields;
- the head must be complete within ``api.header_timeout_s`` of the connection opening, or of
  the first byte of its next request: else 408 and closed;
- a process holds at most ``api.max_connections`` connections (lowered to fit the open-file
  limit): one more is answered 503 with ``Retry-After`` and closed, its request unread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.api.job_progress import release_waiters
from service.settings import get_settings

logger = logging.getLogger("zeropilot.api")
LINGER_S = 1.0  # a refused connection drops what still arrives this long, then closes
MAX_TURNED_AWAY_LINGERING = 64  # connections past the cap lingering at once
# Descriptors the process needs besides the capped connections: those lingering past the cap,
# the database pool, logs, the listening socket, Prometheus files, the interpreter's own.
FD_RESERVE = MAX_TURNED_AWAY_LINGERING + 64


@dataclass(frozen=True)
class HeadLimits:
    max_header_bytes: int
    max_header_count: int
    header_timeout_s: float
    max_connections: int


@cache
def head_limits() -> HeadLimits:
    """The settings' limits, the connection cap lowered to fit the open-file limit."""
    api = get_settings().api
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fits = api.max_connections if soft == resource.RLIM_INFINITY else soft - FD_RESERVE
    cap = max(1, min(api.max_connections, fits))
    if cap < api.max_connections:
        logger.warning(
            "api.max_connections lowered from %d to %d: the open-file limit is %d",
            api.max_connections,
            cap,
            soft,
        )
    return HeadLimits(api.max_header_bytes, api.max_header_count, api.header_timeout_s, cap)


def raise_open_file_limit() -> None:
    """Raise the soft open-file limit to the hard one, so the connection cap fits under it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unlimited hard limit is refused by some kernels; the cap then fits the soft one.
    with contextlib.suppress(ValueError, OSError):
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class HeadRefused(Exception):
    """Raised in a parser callback to stop parsing; uvicorn then answers through
    ``send_400_response``, which sends this refusal instead."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    turned_away_lingering: ClassVar[int] = 0  # connections past the cap not yet closed

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = head_limits()
        self.head_open = True  # the bytes arriving belong to a request head
        self.head_fed = 0  # bytes fed to the parser since this head began
        self.head_parsed = 0  # bytes of the head's complete fields
        self.header_count = 0
        self.head_timer: asyncio.TimerHandle | None = None
        self.refusal: tuple[int, str] | None = None
        self.turned_away = False
        self.lingers = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            self.turned_away = True
            self.transport = transport
            limit = self.limits.max_connections
            detail = f"the server holds its limit of {limit} connections (api.max_connections)"
            self._answer_and_linger(503, f"{detail}; retry", (b"retry-after: 1",))
            return
        super().connection_made(transport)
        self._start_head_timer()

    def shutdown(self) -> None:
        release_waiters()  # held long polls answer now, not after the graceful timeout
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self.lingers:
            LimitedHttpToolsProtocol.turned_away_lingering -= 1
        if not self.turned_away:
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.turned_away or self.refusal is not None:
            return  # what follows a refusal is not read
        if self.head_open:
            self.head_fed += len(data)
        super().data_received(data)
        if self.refusal is None and self.head_open and self.head_fed > self.limits.max_header_bytes:
            self._refuse_head_bytes()
            self._answer_refusal()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_open, self.head_parsed, self.header_count = True, 0, 0
        if self.head_timer is None:  # a kept-alive connection's next request
            self._start_head_timer()

    def on_url(self, url: bytes) -> None:
        self._count_head_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_count += 1
        if self.header_count > self.limits.max_header_count:
            limit = self.limits.max_header_count
            self.refusal = (
                431,
                f"the request has more than {limit} headers (api.max_header_count)",
            )
            raise HeadRefused
        self._count_head_bytes(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self.head_open, self.head_fed = False, 0
        self._cancel_head_timer()
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if self.refusal is None:
            super().send_400_response(msg)
        else:
            self._answer_refusal()

    def _count_head_bytes(self, size: int) -> None:
        self.head_parsed += size
        if self.head_parsed > self.limits.max_header_bytes:
            self._refuse_head_bytes()
            raise HeadRefused

    def _refuse_head_bytes(self) -> None:
        limit = self.limits.max_header_bytes
        self.refusal = (
            431,
            f"the request's line and headers are over the limit of {limit} bytes "
            "(api.max_header_bytes)",
        )

    def _start_head_timer(self) -> None:
        self.head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.transport.is_closing():
            return
        seconds = self.limits.header_timeout_s
        self.refusal = (
            408,
            f"the request's headers did not arrive within {seconds:g} s (api.header_timeout_s)",
        )
        self._answer_refusal()

    def _answer_refusal(self) -> None:
        if self.refusal is None or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head, refused while the answer before it is sent: that answer ends
            # whole, then the connection closes, and the refused request gets none.
            self.cycle.keep_alive = False
            self.flow.pause_reading()
            return
        self._answer_and_linger(*self.refusal)

    def _answer_and_linger(self, status: int, detail: str, extra: tuple[bytes, ...] = ()) -> None:
        """Answer, then drop what the client still sends for up to LINGER_S before closing:
        closing with its bytes unread would reset the connection, and a reset can destroy the
        answer before the client reads it. A connection turned away at the cap lingers only
        while fewer than MAX_TURNED_AWAY_LINGERING do (they are outside the cap); past that,
        in a flood, it is closed at once."""
        self._cancel_head_timer()
        self.transport.write(_answer(status, detail, extra))
        crowded = self.turned_away and self.turned_away_lingering >= MAX_TURNED_AWAY_LINGERING
        if crowded or not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()  # the client reads the answer, then its end of the stream
        if self.turned_away:
            LimitedHttpToolsProtocol.turned_away_lingering += 1
            self.lingers = True
        self.loop.call_later(LINGER_S, self.transport.close)


def _answer(status: int, detail: str, extra: tuple[bytes, ...] = ()) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    head = [
        f"HTTP/1.1 {status} {_REASONS[status]}".encode(),
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
        *extra,
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


_REASONS = {
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}
