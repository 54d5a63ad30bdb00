"""A scripted HTTP server on loopback for the client's tests: it answers each request with the
next answer of its script (the last one repeats) and records each request (its line, headers
and Idempotency-Key) and each connection it accepted."""

from __future__ import annotations

import json
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = tuple[int, dict[str, str], dict[str, Any] | list[Any]]  # status, headers, JSON body
DROP: Answer = (0, {}, {})  # close the connection without an answer


class ScriptedApi:
    def __init__(
        self,
        answers: list[Answer],
        keep_alive: bool = False,
        idle_close_s: float | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``keep_alive``: HTTP/1.1, the connection kept after an answer; ``idle_close_s``:
        close a kept connection idle that long (as uvicorn's keep-alive timeout does)."""
        self.answers = answers
        self.keys: list[str | None] = []  # one per request received
        self.requests: list[tuple[str, dict[str, str]]] = []  # request line, headers
        self.connections = 0
        lock = threading.Lock()
        script = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"
            timeout = idle_close_s

            def setup(self) -> None:
                super().setup()
                with lock:
                    script.connections += 1

            def answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    script.keys.append(self.headers.get("Idempotency-Key"))
                    script.requests.append((self.requestline, dict(self.headers.items())))
                    code, headers, body = script.answers[min(len(script.keys), len(answers)) - 1]
                if code == 0:
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                payload = json.dumps(body).encode()
                self.send_response(code)
                for name, value in {**headers, "Content-Length": str(len(payload))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PATCH = answer

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def serve(scripted: list[ScriptedApi], *answers: Answer, **options: Any) -> ScriptedApi:
    """Start a server with this script; the ``scripted`` fixture stops it after the test."""
    api = ScriptedApi(list(answers), **options)
    scripted.append(api)
    return api
