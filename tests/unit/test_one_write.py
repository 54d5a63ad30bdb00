"""The SDK sends each request in one write (head and body together): httpcore alone writes
them separately, and each write costs the kernel a delivery and the server a wake-up."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from httpcore._backends.sync import SyncStream

from tests.unit.scripted_api import DROP, ScriptedApi, serve
from zeropilot.client import Client, GaveUp

JOB = {"id": "j1", "name": "tiny", "status": "QUEUED"}


Writes = list[tuple[int, bytes]]  # the peer's port, the bytes


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Writes:
    """Every write to a socket httpcore makes in this process, as sent (an empty one sends
    nothing), with the port it went to: other tests' clients may still be running."""
    sent: Writes = []
    real = SyncStream.write

    def spy(self: SyncStream, buffer: bytes, timeout: float | None = None) -> None:
        if buffer:
            sent.append((self.get_extra_info("server_addr")[1], bytes(buffer)))
        real(self, buffer, timeout)

    monkeypatch.setattr(SyncStream, "write", spy)
    return sent


def to(api: ScriptedApi, writes: Writes) -> list[bytes]:
    return [data for port, data in writes if port == api.server.server_address[1]]


def test_plain_httpx_writes_a_post_in_two(scripted: list[ScriptedApi], writes: Writes) -> None:
    api = serve(scripted, (201, {}, JOB))
    with httpx.Client() as plain:
        plain.post(f"{api.url}/v1/jobs", json={"name": "tiny"})
    assert len(to(api, writes)) == 2  # what the SDK avoids


def test_a_submit_goes_out_in_one_write(scripted: list[ScriptedApi], writes: Writes) -> None:
    api = serve(scripted, (201, {}, JOB))
    assert Client(api.url, "zp_t").submit({"name": "tiny"}, idempotency_key="k1") == JOB
    sent = to(api, writes)
    assert len(sent) == 1
    head, _, body = sent[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/jobs HTTP/1.1\r\n")
    assert b"\r\nidempotency-key: k1" in head.lower()
    assert json.loads(body) == {"name": "tiny"}


def test_a_dropped_connection_is_still_a_transport_error_retried_with_the_key(
    scripted: list[ScriptedApi],
) -> None:
    api = serve(scripted, DROP)
    with pytest.raises(GaveUp) as gave_up:
        Client(api.url, "zp_t").submit({"name": "tiny"}, idempotency_key="k1", tries=2,
                                       on_retry=_no_wait)  # fmt: skip
    assert api.keys == ["k1", "k1"] and gave_up.value.maybe_stored


def _no_wait(*_: Any) -> None:
    pass
