"""Each HTTP request sent in one write.

httpcore writes a request's head and its body separately: two sends, so two deliveries by the
kernel and two wake-ups of the server for one request. On loopback that cost the API 0.1-1.0 ms
of CPU per submit in each of six measured pairs (docs/benchmarks.md). Here what a request
writes is held and sent together just before its answer is read, which in HTTP/1.1 always
follows the whole request; an error of that send comes out of the read as the same httpx
transport error (``WriteError``).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx


class _OneWriteStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream
        self._held: list[bytes] = []

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._held.append(buffer)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._held:
            request, self._held = b"".join(self._held), []
            self._stream.write(request, timeout)
        return self._stream.read(max_bytes, timeout)

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        return _OneWriteStream(self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _OneWriteBackend(httpcore.SyncBackend):
    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        stream = super().connect_tcp(host, port, timeout, local_address, socket_options)
        return _OneWriteStream(stream)


def send_each_request_in_one_write(client: httpx.Client) -> bool:
    """Give ``client``'s direct connections (not those through a proxy) the one-write backend;
    False if this httpx keeps its pool elsewhere (then requests go as before)."""
    pool = getattr(getattr(client, "_transport", None), "_pool", None)
    if not isinstance(pool, httpcore.ConnectionPool) or not isinstance(
        getattr(pool, "_network_backend", None), httpcore.SyncBackend
    ):
        return False
    pool._network_backend = _OneWriteBackend()
    return True
