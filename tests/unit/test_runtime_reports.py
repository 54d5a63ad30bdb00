"""The training process's reports: metrics leave from a background thread, a second's points
in one request, so a slow API does not hold a step; every other report goes after the metrics
before it; the process's exit waits for the last ones.

The API is played by a small HTTP server that records what arrives and can hold its answers
(the real API's handling of these reports: the end-to-end tests)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from zeropilot.runtime import Reporter

REPO = Path(__file__).resolve().parents[2]


class Api:
    def __init__(self) -> None:
        self.received: list[tuple[str, Any]] = []  # (route below the attempt, body)
        self.answer = threading.Event()
        self.answer.set()
        self.status = 202
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.answer.wait(10)
                api.received.append((self.path.split("/a1/", 1)[1], body))
                self.send_response(api.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None: ...

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def api() -> Iterator[Api]:
    served = Api()
    thread = threading.Thread(target=served.server.serve_forever, daemon=True)
    thread.start()
    yield served
    served.answer.set()
    served.server.shutdown()


def test_metrics_do_not_wait_for_the_api_and_a_checkpoint_goes_after_them(api: Api) -> None:
    reporter = Reporter(url=api.url, attempt_id="a1", token="t")
    api.answer.clear()  # the API holds every answer: a step that waited would block here

    for step in (1, 2, 3):
        reporter.metrics(step, loss=1.0 / step)
    queued_while_held = list(api.received)
    api.answer.set()
    reporter.checkpoint(3, "/tmp/ckpt/global_step3")

    assert queued_while_held == []  # all three calls returned while nothing was answered
    # Step 1 left at once with what was queued by then; the rest gathered behind it.
    *batches, (after, checkpoint) = api.received
    assert {kind for kind, _points in batches} == {"metrics/batch"} and len(batches) <= 2
    assert [p["step"] for _kind, points in batches for p in points] == [1, 2, 3]
    assert (after, checkpoint["step"]) == ("checkpoints", 3)


def test_the_last_metrics_are_sent_before_the_process_exits(api: Api) -> None:
    script = (
        "from zeropilot.runtime import Reporter\n"
        f"r = Reporter(url={api.url!r}, attempt_id='a1', token='t')\n"
        "for step in range(1, 51):\n"
        "    r.metrics(step, loss=0.5)\n"
    )  # ends right after queueing: the exit's flush sends them
    subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, timeout=60)

    assert [p["step"] for _kind, points in api.received for p in points] == list(range(1, 51))
    assert len(api.received) < 5, "gathered into a few requests, not one a step"


def test_queued_reports_stop_once_the_api_says_the_attempt_has_ended(api: Api) -> None:
    reporter = Reporter(url=api.url, attempt_id="a1", token="t")
    api.status = 401  # the attempt ended (or its job was cancelled): later ones would be too
    api.answer.clear()

    reporter.metrics(1, loss=1.0)
    reporter.flush(timeout_s=0.5)  # step 1 is sent; its answer is held
    for step in (2, 3):
        reporter.metrics(step, loss=1.0)  # queued behind it
    api.answer.set()
    reporter.flush()

    assert [[p["step"] for p in points] for _kind, points in api.received] == [[1]]
    assert not reporter.enabled
