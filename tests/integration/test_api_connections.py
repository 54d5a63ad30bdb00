"""The API process's limits on request heads and connections (``service/api/connection_limits.py``),
over real sockets against ``python -m service.api.serve``, the command every deployment runs:
100,000 headers, a 50 MiB header, eight concurrent 64 MiB headers (the process's RSS is read
from /proc before, during and after), 300 clients that trickle their heads and never finish
them, and a process at its connection cap. Meanwhile another client keeps asking for its jobs
with a real token, and every one of those requests must answer 200.

The measured numbers are printed (``pytest -s``); docs/limits.md reports them.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from service.db.migrate import upgrade
from tests.e2e.stack import free_port
from tests.integration.helpers import auth, three_users

REPO = Path(__file__).resolve().parents[2]
HEADER_TIMEOUT_S = 3.0  # short, so the slow clients' test is quick; the default is 10 s
MIB = 1 << 20
T = TypeVar("T")


@dataclass
class Api:
    port: int
    process: subprocess.Popen[bytes]
    token: str

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024


def start_api(tmp: Path, open_files: int | None = None, **api_settings: str) -> Api:
    """The API process on a fresh SQLite database, its open-file limit (soft and hard) set."""
    url = f"sqlite:///{tmp / 'zeropilot.db'}"
    upgrade(url)
    token = three_users(url)["alice"]
    port = free_port()
    env = {
        **os.environ,
        "ZEROPILOT_DATA_DIR": str(tmp / "data"),
        "ZEROPILOT_DB__URL": url,
        "ZEROPILOT_AUTH__SECRET_KEY": "test-secret-key",
        "ZEROPILOT_API__HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        **{f"ZEROPILOT_API__{key.upper()}": value for key, value in api_settings.items()},
    }
    argv = [sys.executable, "-m", "service.api.serve", "--port", str(port)]
    log = (tmp / "api.log").open("wb")
    limit = (
        (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files)))
        if open_files
        else None
    )
    process = subprocess.Popen(
        [*argv, "--log-level", "warning"],
        env=env,
        cwd=REPO,
        stdout=log,
        stderr=log,
        preexec_fn=limit,
    )
    api = Api(port, process, token)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if ask(api)[0] == 200:
                return api
        assert process.poll() is None, (tmp / "api.log").read_text()
        time.sleep(0.2)
    raise AssertionError("the API did not start")


def stop_api(api: Api) -> None:
    api.process.terminate()
    api.process.wait(timeout=30)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    started = start_api(tmp_path_factory.mktemp("api"))
    yield started
    stop_api(started)


def ask(api: Api) -> tuple[int, float]:
    """A normal request, as a user's client sends it: its status and how long it took."""
    start = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", api.port, timeout=30)
    try:
        connection.request("GET", "/v1/jobs", headers=auth(api.token))
        response = connection.getresponse()
        response.read()
        return response.status, time.monotonic() - start
    finally:
        connection.close()


@dataclass
class Bystander:
    """Another client asking for its jobs every 0.1 s while a test's attack runs."""

    api: Api
    answers: list[tuple[int, float]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while True:
            try:
                self.answers.append(ask(self.api))
            except OSError as exc:
                self.answers.append((-1, float("nan")))
                print(f"bystander: {exc!r}")
            if self.stop.wait(0.1):
                return

    def report(self, what: str) -> None:
        times = sorted(seconds for _status, seconds in self.answers)
        assert self.answers and all(status == 200 for status, _ in self.answers), self.answers
        median, worst = times[len(times) // 2], times[-1]
        print(
            f"{what}: {len(times)} normal requests, all 200, "
            f"median {median * 1000:.1f} ms, max {worst * 1000:.1f} ms"
        )


@contextlib.contextmanager
def bystander(api: Api, what: str) -> Iterator[Bystander]:
    other = Bystander(api)
    thread = threading.Thread(target=other.run, daemon=True)
    thread.start()
    try:
        yield other
    finally:
        other.stop.set()
        thread.join()
    other.report(what)


@contextlib.contextmanager
def rss_peak(api: Api, what: str, within_mib: float) -> Iterator[None]:
    """The API's RSS before, at its peak (sampled every 20 ms) and after the block."""
    before, done = api.rss_mib(), threading.Event()
    peak = [before]

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], api.rss_mib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield
    finally:
        done.set()
        sampler.join()
    after = api.rss_mib()
    peak[0] = max(peak[0], after)
    print(
        f"{what}: API RSS {before:.1f} MiB before, {peak[0]:.1f} MiB at peak, {after:.1f} MiB after"
    )
    assert peak[0] - before < within_mib


def send_head(api: Api, pieces: Callable[[], Iterator[bytes]]) -> bytes:
    """Stream a head from a thread (the server may stop reading it) and read the answer."""
    sock = socket.create_connection(("127.0.0.1", api.port))

    def write() -> None:
        with contextlib.suppress(OSError):  # refused and closed while it still sends
            for piece in pieces():
                sock.sendall(piece)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    answer = read_all(sock, timeout_s=60)
    writer.join(timeout=60)
    sock.close()
    return answer


def read_all(sock: socket.socket, timeout_s: float) -> bytes:
    sock.settimeout(timeout_s)
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


REQUEST_LINE = b"GET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def many_headers(count: int) -> Callable[[], Iterator[bytes]]:
    def pieces() -> Iterator[bytes]:
        yield REQUEST_LINE
        for start in range(0, count, 1000):
            yield b"".join(b"X-H%d: v\r\n" % n for n in range(start, min(count, start + 1000)))
        yield b"\r\n"

    return pieces


def one_big_header(size: int) -> Callable[[], Iterator[bytes]]:
    def pieces() -> Iterator[bytes]:
        yield REQUEST_LINE + b"X-Big: "
        chunk = b"a" * MIB
        for _ in range(size // MIB):
            yield chunk
        yield b"\r\n\r\n"

    return pieces


def test_a_head_within_the_limits_is_served(api: Api) -> None:
    # 100 headers in all, 60 KiB: at the count limit, under the size limit.
    headers = b"".join(b"X-H%d: %s\r\n" % (n, b"v" * 620) for n in range(97))
    head = b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n" % api.token.encode()
    answer = send_head(api, lambda: iter([head + headers + b"Connection: close\r\n\r\n"]))
    assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:300]


def test_pipelined_requests_are_both_served(api: Api) -> None:
    head = b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n" % api.token.encode()
    both = head + b"\r\n" + head + b"Connection: close\r\n\r\n"
    answer = send_head(api, lambda: iter([both]))
    assert answer.count(b"HTTP/1.1 200 OK") == 2, answer[:600]


def test_100000_headers_are_refused_naming_the_count_limit(api: Api) -> None:
    with bystander(api, "100,000 headers"):
        answer = send_head(api, many_headers(100_000))
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large"), answer[:300]
    assert b"more than 100 headers (api.max_header_count)" in answer


def test_a_50_mib_header_is_refused_naming_the_size_limit(api: Api) -> None:
    with bystander(api, "a 50 MiB header"), rss_peak(api, "a 50 MiB header", within_mib=16):
        answer = send_head(api, one_big_header(50 * MIB))
    assert answer.startswith(b"HTTP/1.1 431"), answer[:300]
    assert b"over the limit of 65536 bytes (api.max_header_bytes)" in answer


def test_concurrent_oversized_headers_keep_the_api_memory_bounded(api: Api) -> None:
    answers: list[bytes] = []
    clients = [
        threading.Thread(target=lambda: answers.append(send_head(api, one_big_header(64 * MIB))))
        for _ in range(8)
    ]
    with bystander(api, "8 concurrent 64 MiB headers"), rss_peak(api, "8 x 64 MiB", within_mib=32):
        for client in clients:
            client.start()
        for client in clients:
            client.join()
    assert len(answers) == 8
    assert all(answer.startswith(b"HTTP/1.1 431") for answer in answers), [a[:60] for a in answers]


def test_slow_heads_are_closed_after_the_header_timeout(api: Api) -> None:
    """300 clients send part of a head, then one byte every 0.5 s, never the end of it."""
    slow = [socket.create_connection(("127.0.0.1", api.port)) for _ in range(300)]
    opened = time.monotonic()
    for sock in slow:
        sock.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        sock.setblocking(False)
    answers = {sock: b"" for sock in slow}
    closed: set[socket.socket] = set()
    with bystander(api, "300 slow heads"):
        while time.monotonic() - opened < HEADER_TIMEOUT_S + 3:
            for sock in set(slow) - closed:
                with contextlib.suppress(OSError):
                    sock.send(b"a")  # still trickling
            readable, _, _ = select.select(list(set(slow) - closed), [], [], 0.5)
            for sock in readable:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                answers[sock] += data
                if not data:
                    closed.add(sock)
    survivors = len(slow) - len(closed)
    timed_out = sum(b"HTTP/1.1 408 Request Timeout" in answer for answer in answers.values())
    print(
        f"300 slow heads: {survivors} still open {HEADER_TIMEOUT_S + 3:.0f} s after opening, "
        f"{timed_out} answered 408"
    )
    for sock in slow:
        sock.close()
    assert survivors == 0
    assert timed_out == 300
    detail = b"did not arrive within 3 s (api.header_timeout_s)"
    assert all(detail in answer for answer in answers.values())


def test_a_kept_alive_connection_must_finish_its_next_head_in_time(api: Api) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", api.port, timeout=30)
    connection.request("GET", "/v1/jobs", headers=auth(api.token))
    first = connection.getresponse()
    first.read()
    assert first.status == 200
    sock = connection.sock  # kept alive
    time.sleep(1.0)  # idle, within the keep-alive timeout (5 s)
    sent = time.monotonic()
    sock.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n")  # and nothing more
    answer = read_all(sock, timeout_s=30)
    waited = time.monotonic() - sent
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout"), answer[:300]
    # Timed from the second head's first byte, not from the connection's opening 1 s before.
    assert HEADER_TIMEOUT_S - 0.5 < waited < HEADER_TIMEOUT_S + 2


def test_a_process_past_its_connection_cap_answers_503_and_serves_again(
    tmp_path: Path,
) -> None:
    api = start_api(tmp_path, max_connections="40")
    try:
        idle = [socket.create_connection(("127.0.0.1", api.port)) for _ in range(40)]
        opened = time.monotonic()
        refused = until(
            lambda: send_head(api, lambda: iter([b"GET /healthz HTTP/1.1\r\n\r\n"])),
            lambda answer: answer.startswith(b"HTTP/1.1 503"),
        )  # once all 40 are in
        assert refused.startswith(b"HTTP/1.1 503 Service Unavailable"), refused[:300]
        assert b"retry-after: 1" in refused
        assert b"its limit of 40 connections (api.max_connections); retry" in refused
        # The idle 40 are cut by the header timeout (and closed after lingering 1 s).
        assert until(lambda: ask(api)[0], lambda status: status == 200) == 200
        assert time.monotonic() - opened > HEADER_TIMEOUT_S
        for sock in idle:
            sock.close()
    finally:
        stop_api(api)


def test_at_a_low_open_file_limit_slow_heads_cannot_starve_the_process(tmp_path: Path) -> None:
    """Open files 400, 420 slow heads: the cap (fitted to 272) answers the rest 503, and once
    the header timeout has cut the slow ones, requests are served again. Without the cap the
    process ran out of descriptors and failed every request, also after the slow ones."""
    api = start_api(tmp_path, open_files=400)
    slow = [socket.create_connection(("127.0.0.1", api.port)) for _ in range(420)]
    try:
        for sock in slow:
            sock.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        time.sleep(1.0)
        during = [ask(api)[0] for _ in range(41)]
        time.sleep(HEADER_TIMEOUT_S + 1.5)
        after = [ask(api)[0] for _ in range(41)]
        print(
            f"open files 400, 420 slow heads: {during.count(503)} of 41 got 503 meanwhile, "
            f"{after.count(200)} of 41 got 200 after the header timeout"
        )
        assert during == [503] * 41
        assert after == [200] * 41
        assert "api.max_connections lowered from 1000 to 272" in (tmp_path / "api.log").read_text()
    finally:
        for sock in slow:
            sock.close()
        stop_api(api)


def until(call: Callable[[], T], done: Callable[[T], bool], within_s: float = 30) -> T:
    """``call()`` every 0.2 s until ``done`` holds for its result or ``within_s`` passed."""
    deadline = time.monotonic() + within_s
    while not done(result := call()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return result


def test_zeropilot_up_serves_the_api_with_the_limits(tmp_path: Path) -> None:
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("ZEROPILOT_")}
    env |= {
        "ZEROPILOT_DATA_DIR": str(tmp_path / "data"),
        "ZEROPILOT_API__PORT": str(port),
        "ZEROPILOT_API__HEADER_TIMEOUT_S": "1",
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    log = (tmp_path / "up.log").open("wb")
    up = [sys.executable, "-m", "zeropilot.cli", "up"]
    process = subprocess.Popen(up, env=env, cwd=REPO, stdout=log, stderr=log)
    try:
        api = Api(port, process, token="")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port)).close()
                break
            time.sleep(0.3)
        assert send_head(api, many_headers(1000)).startswith(b"HTTP/1.1 431"), log.name
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert read_all(slow, timeout_s=30).startswith(b"HTTP/1.1 408 Request Timeout")
        slow.close()
    finally:
        process.terminate()
        process.wait(timeout=60)
