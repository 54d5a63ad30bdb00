"""A scripted HTTP server on loopback for the client's tests: it answers each request with the
next answer of its script (the last one repeats) and records each request's Idempotency-Key."""

from __future__ import annotations

import json
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any

Answer = tuple[int, dict[str, str], dict[str, Any] | list[Any]]  # status, headers, JSON body
DROP: Answer = (0, {}, {})  # close the connection without an answer


class ScriptedApi:
    def __init__(self, answers: list[Answer]) -> None:
        self.answers = answers
        self.keys: list[str | None] = []  # one per request received
        script = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                script.keys.append(self.headers.get("Idempotency-Key"))
                code, headers, body = script.answers[min(len(script.keys), len(answers)) - 1]
                if code == 0:
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                payload = json.dumps(body).encode()
                self.send_response(code)
                for name, value in {**headers, "Content-Length": str(len(payload))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = answer

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        Thread(target=self.server.serve_forever, daemon=True).start()


def serve(scripted: list[ScriptedApi], *answers: Answer) -> ScriptedApi:
    """Start a server with this script; the ``scripted`` fixture stops it after the test."""
    api = ScriptedApi(list(answers))
    scripted.append(api)
    return api
