"""The submit's plain route answers as its FastAPI contract does, for any body.

The same request is sent twice: declared ``application/json`` (which the plain route serves
when it can read it) and ``application/json; charset=utf-8`` (which it always hands to the
FastAPI route). Status and body must agree, ids and times aside, for hostile specs (the
fuzzer's), for bodies the two parsers might read differently (duplicate keys, numbers as text,
floats for integers), and for the headers the route reads itself.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given

from service.api import plain_submit
from tests.integration.helpers import auth, queued_tasks, tiny_spec
from tests.integration.test_fuzz_spec_and_reports import FUZZ, SPEC, SPEC_MAPPINGS, mutated

PLAIN = "application/json"
CONTRACT = "application/json; charset=utf-8"  # not the plain route's: always the contract's
VARYING = {"id", "job_id", "created_at", "updated_at", "at", "started_at", "finished_at"}


def both(client: TestClient, content: str, headers: dict[str, str]) -> tuple[Any, Any]:
    """The answers of the plain route and of the contract to the same body."""
    answers = [
        client.post("/v1/jobs", content=content, headers={**headers, "Content-Type": kind})
        for kind in (PLAIN, CONTRACT)
    ]
    return answers[0], answers[1]


def comparable(answer: Any) -> tuple[int, Any]:
    body = answer.json()
    ids = {body["id"]} if isinstance(body, dict) and "id" in body else set()
    return answer.status_code, _without(body, ids)


def _without(value: Any, ids: set[str]) -> Any:
    """``value`` without what differs between two stored jobs: ids, times, names built on ids."""
    if isinstance(value, dict):
        return {k: _without(v, ids) for k, v in value.items() if k not in VARYING}
    if isinstance(value, list):
        return [_without(v, ids) for v in value]
    if isinstance(value, str):
        for one in ids:  # backend names carry the id's first 8 characters
            value = value.replace(one, "<id>").replace(one[:8], "<id>")
    return value


def assert_same_answer(client: TestClient, content: str, headers: dict[str, str]) -> None:
    plain, contract = both(client, content, headers)
    assert comparable(plain) == comparable(contract), (plain.text[:1000], contract.text[:1000])


@given(case=mutated(SPEC, SPEC_MAPPINGS))
@FUZZ
def test_a_hostile_spec_gets_the_contracts_answer(
    shared_client: TestClient, shared_tokens: dict[str, str], case: tuple[Any, Any]
) -> None:
    body, _ = case
    assert_same_answer(shared_client, json.dumps(body), auth(shared_tokens["alice"]))


LENIENT = [
    # Duplicate keys: both parsers keep the last.
    '{"name": "first", ' + json.dumps(tiny_spec(name="last"))[1:],
    json.dumps(tiny_spec(priority="7")),  # numbers as text
    json.dumps(tiny_spec(priority=7.0)),  # a float that is an integer
    json.dumps(tiny_spec(priority=7.5)),  # one that is not: refused by both
    json.dumps(tiny_spec(unknown_field=1)),
    json.dumps(tiny_spec())[:-1],  # not JSON
    "",
    "null",
    "[]",
]


@pytest.mark.parametrize("content", LENIENT)
def test_a_body_the_parsers_might_read_differently_gets_one_answer(
    shared_client: TestClient, shared_tokens: dict[str, str], content: str
) -> None:
    assert_same_answer(shared_client, content, auth(shared_tokens["alice"]))


@pytest.mark.parametrize(
    ("headers", "as_alice"),
    [
        ({}, False),  # no token
        ({"Authorization": "Basic abc"}, False),
        ({"Authorization": "Bearer not-a-token"}, False),
        ({"Idempotency-Key": "has space"}, True),
        ({"Idempotency-Key": "k" * 256}, True),
        ({"Idempotency-Key": ""}, True),
    ],
    ids=["no-token", "basic", "unknown-token", "key-with-space", "key-too-long", "empty-key"],
)
def test_the_headers_the_route_reads_get_the_contracts_answer(
    shared_client: TestClient,
    shared_tokens: dict[str, str],
    headers: dict[str, str],
    as_alice: bool,
) -> None:
    token = auth(shared_tokens["alice"]) if as_alice else {}
    assert_same_answer(shared_client, json.dumps(tiny_spec()), {**token, **headers})


def test_a_replayed_key_returns_the_first_job_through_either_route(
    shared_client: TestClient, shared_tokens: dict[str, str], shared_settings: Any
) -> None:
    headers = {**auth(shared_tokens["alice"]), "Idempotency-Key": "plain-route-replay"}
    before = len(queued_tasks(shared_settings.broker.url))
    first, again = both(shared_client, json.dumps(tiny_spec(name="replayed")), headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert len(queued_tasks(shared_settings.broker.url)) == before + 1  # one launch, not two


def test_a_well_formed_submit_is_served_by_the_plain_route(
    shared_client: TestClient, shared_tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Else the comparisons above would compare the contract with itself."""
    served: list[str] = []
    real = plain_submit.submit

    def counted(*args: Any) -> Any:
        served.append("plain")
        return real(*args)

    monkeypatch.setattr(plain_submit, "submit", counted)
    plain, contract = both(shared_client, json.dumps(tiny_spec()), auth(shared_tokens["alice"]))
    assert (plain.status_code, contract.status_code) == (201, 201)
    assert served == ["plain"]
