"""Reads through outages: a GET that meets a 503 or a lost connection is sent again (Retry-After
honoured) and a bounded number of times; other answers, and writes, are not. The server is a
scripted HTTP server on loopback; the real API's database outage is in tests/e2e/test_cli.py."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any

import httpx
import pytest

from zeropilot.client import READ_TRIES, ApiError, Client

JOB = {"id": "j1", "name": "tiny", "status": "RUNNING"}
OUTAGE = (503, {"Retry-After": "0"}, {"detail": "the database is unavailable; retry"})
FOUND = (200, {}, JOB)
DROP = (0, {}, {})  # close the connection without an answer


class ScriptedApi:
    """Answers every request from a script, in order, and counts them."""

    def __init__(self, answers: list[tuple[int, dict[str, str], dict[str, Any]]]) -> None:
        self.answers, self.requests = answers, 0
        script = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                script.requests += 1
                code, headers, body = script.answers[min(script.requests, len(answers)) - 1]
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


@pytest.fixture
def serve() -> Iterator[Any]:
    made: list[ScriptedApi] = []

    def start(*answers: tuple[int, dict[str, str], dict[str, Any]]) -> ScriptedApi:
        made.append(ScriptedApi(list(answers)))
        return made[-1]

    yield start
    for api in made:
        api.server.shutdown()
        api.server.server_close()


def test_a_read_through_an_outage_and_a_lost_connection_gets_its_answer(serve: Any) -> None:
    api = serve(OUTAGE, DROP, FOUND)
    assert Client(api.url, "zp_t").get_job("j1") == JOB
    assert api.requests == 3


def test_a_read_gives_up_after_its_tries_with_the_last_answer(serve: Any) -> None:
    api = serve(OUTAGE)
    with pytest.raises(ApiError) as raised:
        Client(api.url, "zp_t").list_jobs()
    assert raised.value.status_code == 503 and api.requests == READ_TRIES


def test_a_refusal_is_not_read_again(serve: Any) -> None:
    api = serve((404, {}, {"detail": "job j1 not found"}), FOUND)
    with pytest.raises(ApiError, match="not found"):
        Client(api.url, "zp_t").get_job("j1")
    assert api.requests == 1


def test_a_write_other_than_submit_is_sent_once(serve: Any) -> None:
    api = serve(OUTAGE, FOUND)
    with pytest.raises(ApiError):
        Client(api.url, "zp_t").cancel("j1")
    api_dropped = serve(DROP, FOUND)
    with pytest.raises(httpx.TransportError):
        Client(api_dropped.url, "zp_t").cancel("j1")
    assert (api.requests, api_dropped.requests) == (1, 1)
