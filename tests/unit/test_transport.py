"""The SDK's HTTP: each request in one write, connections kept alive and shared by threads, a
connection the server closed while idle never costs a request, TLS verified, proxies from the
environment, and errors that say whether anything was sent. The server is a scripted HTTP
server on loopback (tests/unit/scripted_api.py)."""

from __future__ import annotations

import base64
import http.client
import json
import re
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.unit.scripted_api import DROP, ScriptedApi, serve
from zeropilot.client import Client, GaveUp
from zeropilot.transport import ConnectionLost, InvalidRequest, TlsRefused

JOB = {"id": "j1", "name": "tiny", "status": "QUEUED"}
Writes = list[tuple[int, bytes]]  # the peer's port, the bytes


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Writes:
    """Every send ``http.client`` makes in this process, with the port it went to."""
    sent: Writes = []
    real = http.client.HTTPConnection.send

    def spy(self: http.client.HTTPConnection, data: Any) -> None:
        sent.append((self.port, bytes(data)))
        real(self, data)

    monkeypatch.setattr(http.client.HTTPConnection, "send", spy)
    return sent


def port(api: ScriptedApi) -> int:
    return int(api.server.server_address[1])


def test_a_submit_goes_out_in_one_write(scripted: list[ScriptedApi], writes: Writes) -> None:
    api = serve(scripted, (201, {}, JOB))
    assert Client(api.url, "zp_t").submit({"name": "tiny"}, idempotency_key="k1") == JOB
    sent = [data for to, data in writes if to == port(api)]
    assert len(sent) == 1  # the head and the body together: one delivery, one wake-up
    head, _, body = sent[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/jobs HTTP/1.1\r\n")
    assert b"\r\nidempotency-key: k1" in head.lower()
    assert b"\r\nauthorization: bearer zp_t" in head.lower()
    assert json.loads(body) == {"name": "tiny"}


def test_a_dropped_connection_is_retried_with_the_same_key(scripted: list[ScriptedApi]) -> None:
    api = serve(scripted, DROP)
    with pytest.raises(GaveUp) as gave_up:
        Client(api.url, "zp_t").submit({"name": "tiny"}, idempotency_key="k1", tries=2,
                                       on_retry=_no_wait)  # fmt: skip
    assert api.keys == ["k1", "k1"] and gave_up.value.maybe_stored


def test_nothing_listening_means_nothing_was_stored(scripted: list[ScriptedApi]) -> None:
    api = serve(scripted, (201, {}, JOB))
    url = api.url
    api.server.shutdown()
    api.server.server_close()
    with pytest.raises(GaveUp) as gave_up:
        Client(url).submit({"name": "tiny"}, tries=2, on_retry=_no_wait)
    assert not gave_up.value.maybe_stored and "cannot connect" in gave_up.value.reason


def test_requests_share_one_kept_alive_connection(scripted: list[ScriptedApi]) -> None:
    api = serve(scripted, (200, {}, JOB), keep_alive=True)
    with Client(api.url, "zp_t") as client:
        for _ in range(5):
            assert client.get_job("j1") == JOB
    assert api.connections == 1


def test_a_connection_the_server_closed_while_idle_costs_no_request(
    scripted: list[ScriptedApi],
) -> None:
    api = serve(scripted, (200, {}, JOB), keep_alive=True, idle_close_s=0.1)
    client = Client(api.url, "zp_t")
    assert client.get_job("j1") == JOB
    time.sleep(0.5)  # the server's idle timeout closes the kept connection
    assert client.cancel("j1") == JOB  # a write, sent once: it must not go to the dead one
    assert (len(api.keys), api.connections) == (2, 2)


def test_threads_share_a_client(scripted: list[ScriptedApi]) -> None:
    api = serve(scripted, (201, {}, JOB), keep_alive=True)
    client = Client(api.url, "zp_t")
    answers: list[dict[str, Any]] = []

    def submit_some() -> None:
        for _ in range(25):
            answers.append(client.submit({"name": "tiny"}))

    threads = [threading.Thread(target=submit_some) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [JOB] * 200
    assert len(set(api.keys)) == 200  # each submit its own key, each sent once
    assert api.connections <= 8  # one per thread at most: connections go back to the pool


def test_ids_stay_one_path_segment(scripted: list[ScriptedApi]) -> None:
    api = serve(scripted, (200, {}, JOB))
    Client(api.url).get_job("a b/../c")
    assert api.requests[0][0] == "GET /v1/jobs/a%20b%2F..%2Fc HTTP/1.1"


def test_what_http_cannot_carry_is_refused_before_sending(scripted: list[ScriptedApi]) -> None:
    api = serve(scripted, (201, {}, JOB))
    client = Client(api.url)
    with pytest.raises(InvalidRequest):
        client.submit({"name": "tiny"}, idempotency_key="k1\r\nX-Admin: yes")
    with pytest.raises(InvalidRequest, match="JSON"):
        client.submit({"learning_rate": float("nan")})
    assert api.keys == []


def test_a_url_it_cannot_use_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="http:// or https://"):
        Client("ftp://example.org")
    with pytest.raises(ValueError, match="port"):
        Client("http://127.0.0.1:99999")


def test_a_base_path_is_kept(scripted: list[ScriptedApi]) -> None:
    api = serve(scripted, (200, {}, JOB))
    Client(f"{api.url}/zeropilot/").list_jobs(status="QUEUED")
    assert api.requests[0][0] == "GET /zeropilot/v1/jobs?limit=50&offset=0&status=QUEUED HTTP/1.1"


def test_an_http_proxy_from_the_environment(
    scripted: list[ScriptedApi], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = serve(scripted, (200, {}, JOB))
    host = proxy.url.removeprefix("http://")
    monkeypatch.setenv("HTTP_PROXY", f"http://us%40r:p%3Ass@{host}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    Client("http://zeropilot.internal:8321", "zp_t").get_job("j1")
    line, headers = proxy.requests[0]
    assert line == "GET http://zeropilot.internal:8321/v1/jobs/j1 HTTP/1.1"
    assert headers["Proxy-Authorization"] == "Basic " + base64.b64encode(b"us@r:p:ss").decode()

    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    api = serve(scripted, (200, {}, JOB))
    Client(api.url).get_job("j1")  # bypassed: straight to the server
    assert api.requests[0][0] == "GET /v1/jobs/j1 HTTP/1.1" and len(proxy.requests) == 1


def test_a_proxy_it_cannot_use_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "socks5://127.0.0.1:1080")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with pytest.raises(ValueError, match=re.escape("socks5://127.0.0.1:1080")):
        Client("https://zeropilot.internal")


def test_tls_is_verified(
    scripted: list[ScriptedApi], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
         "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)
    api = serve(scripted, (200, {}, JOB), keep_alive=True, tls=server_side)
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)

    with pytest.raises(TlsRefused, match="certificate"):
        Client(api.url).get_job("j1")  # not trusted: refused, and not tried again
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    assert Client(api.url).get_job("j1") == JOB
    assert api.keys == [None]  # only the trusted try sent a request


def test_an_answer_cut_short_is_a_lost_connection(scripted: list[ScriptedApi]) -> None:
    api = serve(scripted, DROP)
    with pytest.raises(ConnectionLost):
        Client(api.url).cancel("j1")
    assert len(api.keys) == 1


def _no_wait(*_: Any) -> None:
    pass
