"""HTTP/1.1 for the SDK on the standard library's ``http.client``.

A submit through httpx cost its caller 1.57 ms of CPU and through ``http.client`` 0.63 ms
(docs/benchmarks.md, fifth pass): for a sweep script that is most of its own share of a submit.
What the SDK needs of HTTP is small: kept-alive connections that several threads may share,
each request in one write (``http.client`` alone sends the head and the body apart), timeouts,
TLS, and proxies from the environment as httpx took them (``HTTP_PROXY``, ``HTTPS_PROXY``,
``ALL_PROXY``, ``NO_PROXY``). Errors come out as ``TransportError`` kinds that say whether the
request may have reached the server, which is what decides whether a write may be sent again.
"""

from __future__ import annotations

import base64
import http.client
import json
import select
import socket
import ssl
import threading
import urllib.request
from dataclasses import dataclass
from email.message import Message
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

USER_AGENT = "zeropilot-sdk"


class TransportError(Exception):
    """No answer came back. ``may_have_arrived``: some of the request may have reached the
    server (a write may have been stored); ``worth_retrying``: another try could succeed."""

    may_have_arrived = True
    worth_retrying = True


class CannotConnect(TransportError):
    """No connection was made, so nothing was sent."""

    may_have_arrived = False


class TlsRefused(CannotConnect):
    """The TLS handshake failed (an untrusted certificate, a name that does not match)."""

    worth_retrying = False


class NoAnswerInTime(TransportError):
    """The request went out and no answer came before the timeout."""


class ConnectionLost(TransportError):
    """The connection broke after the request went out, before the whole answer came."""


class InvalidRequest(TransportError):
    """This side's mistake (a character a URL or a header cannot carry): nothing was sent."""

    may_have_arrived = False
    worth_retrying = False


@dataclass(frozen=True)
class Response:
    status_code: int
    headers: Message  # case-insensitive ``get``
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


class _OneWrite(http.client.HTTPConnection):
    """Holds what ``request`` writes (``http.client`` sends the head and the body apart) and
    sends it in one write: one delivery and one wake-up of the server per request."""

    _held: list[bytes] | None = None

    def send(self, data: Any) -> None:
        if self._held is not None:
            self._held.append(bytes(data))
        else:
            super().send(data)

    def request(  # type: ignore[override]
        self, method: str, url: str, body: bytes | None = None, headers: Any = None
    ) -> None:
        self._held = []
        try:
            super().request(method, url, body, headers or {})
            whole = b"".join(self._held)
        finally:
            self._held = None
        self.send(whole)


class _OneWriteTls(_OneWrite, http.client.HTTPSConnection):
    pass


@dataclass(frozen=True)
class _Route:
    """Where connections go: the server itself, or a proxy in front of it."""

    connect_host: str
    connect_port: int
    absolute_target: bool  # a plain-HTTP proxy takes the whole URL as the request target
    tunnel: tuple[str, int] | None  # an HTTPS server behind a proxy: CONNECT to it first
    proxy_headers: dict[str, str]


class Transport:
    """Requests to one base URL over a small pool of kept-alive connections; thread-safe (a
    connection serves one request at a time)."""

    def __init__(self, url: str, headers: dict[str, str], timeout: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the zeropilot URL must be http:// or https:// with a host: {url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise ValueError(f"the zeropilot URL has a bad port: {url!r}") from exc
        self._origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
        self._base_path = parts.path.rstrip("/")
        self._headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **headers}
        self._timeout = timeout
        self._route = _route(parts.scheme, parts.hostname, port)
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        target = self._base_path + path + (f"?{urlencode(params)}" if params else "")
        sent = {**self._headers, **(headers or {})}
        if self._route.absolute_target:  # a plain-HTTP proxy: the whole URL, its credentials
            target = self._origin + target
            sent.update(self._route.proxy_headers)
        body = None
        if json_body is not None:
            try:
                body = json.dumps(json_body, separators=(",", ":"), allow_nan=False).encode()
            except ValueError as exc:  # NaN or infinity: JSON has no way to write them
                raise InvalidRequest(f"the request body cannot be sent as JSON: {exc}") from exc
            sent["Content-Type"] = "application/json"
        connection = self._take()
        try:
            if connection.sock is None:
                self._connect(connection)
            try:
                connection.request(method, target, body=body, headers=sent)
            except (ValueError, http.client.InvalidURL) as exc:  # refused before sending
                raise InvalidRequest(str(exc)) from exc
            answer = connection.getresponse()
            response = Response(answer.status, answer.headers, answer.read())
        except TimeoutError as exc:
            connection.close()
            raise NoAnswerInTime(f"no answer in {self._timeout:g} s") from exc
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise ConnectionLost(_describe(exc)) from exc
        except TransportError:
            connection.close()
            raise
        if answer.will_close:
            connection.close()
        else:
            with self._lock:
                self._idle.append(connection)
        return response

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _take(self) -> http.client.HTTPConnection:
        """An idle connection the server has not closed, else a new (unconnected) one."""
        while True:
            with self._lock:
                if not self._idle:
                    break
                connection = self._idle.pop()
            if connection.sock is not None and not _readable(connection.sock):
                return connection
            connection.close()  # readable while idle: the server closed it (or misbehaved)
        route = self._route
        if self._tls is not None:
            return _OneWriteTls(
                route.connect_host, route.connect_port, timeout=self._timeout, context=self._tls
            )
        return _OneWrite(route.connect_host, route.connect_port, timeout=self._timeout)

    def _connect(self, connection: http.client.HTTPConnection) -> None:
        if self._route.tunnel is not None:
            host, port = self._route.tunnel
            connection.set_tunnel(host, port, headers=self._route.proxy_headers)
        try:
            connection.connect()
        except ssl.SSLCertVerificationError as exc:
            raise TlsRefused(f"TLS: {exc.verify_message or exc.reason}") from exc
        except ssl.SSLError as exc:
            raise TlsRefused(f"TLS: {exc.reason or exc}") from exc
        except TimeoutError as exc:
            raise CannotConnect(f"connecting timed out after {self._timeout:g} s") from exc
        except OSError as exc:
            raise CannotConnect(_describe(exc)) from exc


def _route(scheme: str, host: str, port: int) -> _Route:
    """Straight to the server, or through the proxy the environment names for ``scheme``."""
    direct = _Route(host, port, False, None, {})
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(host):
        return direct
    parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"only http:// proxies are supported, not {proxy!r} (environment)")
    credentials = {}
    if parts.username is not None:
        user_pass = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        credentials["Proxy-Authorization"] = f"Basic {base64.b64encode(user_pass).decode()}"
    proxy_port = parts.port or 80
    if scheme == "https":
        return _Route(parts.hostname, proxy_port, False, (host, port), credentials)
    return _Route(parts.hostname, proxy_port, True, None, credentials)


def _readable(sock: socket.socket) -> bool:
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True  # closed or broken: not worth a try


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
