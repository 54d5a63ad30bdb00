"""Reads through outages: a GET that meets a 503 or a lost connection is sent again (Retry-After
honoured) and a bounded number of times; other answers, and writes, are not. The server is a
scripted HTTP server on loopback; the real API's database outage is in tests/e2e/test_cli.py."""

from __future__ import annotations

import pytest

from tests.unit.scripted_api import DROP, Answer, ScriptedApi, serve
from zeropilot.client import READ_TRIES, ApiError, Client
from zeropilot.transport import TransportError

JOB = {"id": "j1", "name": "tiny", "status": "RUNNING"}
OUTAGE: Answer = (503, {"Retry-After": "0"}, {"detail": "the database is unavailable; retry"})
FOUND: Answer = (200, {}, JOB)


def test_a_read_through_an_outage_and_a_lost_connection_gets_its_answer(
    scripted: list[ScriptedApi],
) -> None:
    api = serve(scripted, OUTAGE, DROP, FOUND)
    assert Client(api.url, "zp_t").get_job("j1") == JOB
    assert len(api.keys) == 3


def test_a_read_gives_up_after_its_tries_with_the_last_answer(
    scripted: list[ScriptedApi],
) -> None:
    api = serve(scripted, OUTAGE)
    with pytest.raises(ApiError) as raised:
        Client(api.url, "zp_t").list_jobs()
    assert raised.value.status_code == 503 and len(api.keys) == READ_TRIES


def test_a_refusal_is_not_read_again(scripted: list[ScriptedApi]) -> None:
    api = serve(scripted, (404, {}, {"detail": "job j1 not found"}), FOUND)
    with pytest.raises(ApiError, match="not found"):
        Client(api.url, "zp_t").get_job("j1")
    assert len(api.keys) == 1


def test_a_write_other_than_submit_is_sent_once(scripted: list[ScriptedApi]) -> None:
    api = serve(scripted, OUTAGE, FOUND)
    with pytest.raises(ApiError):
        Client(api.url, "zp_t").cancel("j1")
    api_dropped = serve(scripted, DROP, FOUND)
    with pytest.raises(TransportError):
        Client(api_dropped.url, "zp_t").cancel("j1")
    assert (len(api.keys), len(api_dropped.keys)) == (1, 1)
