"""What the console's pages read (/console/api/*) and what /metrics counts, through the real
application on a real database: visibility per team, the queue's admission order, and counters
that move only for committed work."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from service.settings import Settings
from tests.integration.helpers import auth, three_users, tiny_spec


@pytest.fixture
def tokens(settings: Settings, client: TestClient) -> dict[str, str]:
    made = three_users(settings.database_url)
    for team in ("vision", "speech"):  # each may hold one 2-GPU job at a time
        response = client.patch(
            f"/v1/teams/{team}", json={"gpu_quota": 2}, headers=auth(made["root"])
        )
        assert response.status_code == 200, response.text
    return made


def submit(client: TestClient, token: str, name: str, **changes: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=tiny_spec(name, **changes), headers=auth(token))
    assert response.status_code == 201, response.text
    return dict(response.json())


def test_queue_lists_waiting_jobs_in_admission_order_each_member_numbering_its_team_alone(
    client: TestClient, tokens: dict[str, str]
) -> None:
    submit(client, tokens["alice"], "v-running")
    waiting_vision = submit(client, tokens["alice"], "v-waits")
    submit(client, tokens["bob"], "s-running")
    waiting_speech = submit(client, tokens["bob"], "s-waits")
    urgent = submit(client, tokens["bob"], "s-urgent", priority=90)
    later = submit(client, tokens["alice"], "v-later")

    every = client.get("/console/api/queue", headers=auth(tokens["root"])).json()
    # Priority first; then, both teams holding 2 GPUs of equal shares, the oldest; then the
    # team holding fewer once s-urgent and v-waits would be admitted (a tie: the oldest).
    assert [(q["position"], q["name"]) for q in every] == [
        (1, "s-urgent"), (2, "v-waits"), (3, "s-waits"), (4, "v-later"),
    ]  # fmt: skip
    assert [q["id"] for q in every] == [
        urgent["id"], waiting_vision["id"], waiting_speech["id"], later["id"],
    ]  # fmt: skip
    assert every[1]["why"] == "team vision holds 2 of its 2-GPU quota; this job needs 2"
    # A member sees its team's jobs numbered among themselves: nothing says how many of
    # another team's jobs go first.
    vision = client.get("/console/api/queue", headers=auth(tokens["alice"])).json()
    assert [(q["position"], q["name"]) for q in vision] == [(1, "v-waits"), (2, "v-later")]
    speech = client.get("/console/api/queue", headers=auth(tokens["bob"])).json()
    assert [(q["position"], q["name"]) for q in speech] == [(1, "s-urgent"), (2, "s-waits")]


def test_jobs_rows_carry_the_plan_summary_and_respect_teams(
    client: TestClient, tokens: dict[str, str]
) -> None:
    submit(client, tokens["alice"], "v-one")
    submit(client, tokens["bob"], "s-one")

    own = client.get("/console/api/jobs", headers=auth(tokens["alice"])).json()
    assert [(row["name"], row["team"]) for row in own["data"]] == [("v-one", "vision")]
    row = own["data"][0]
    assert (row["nodes"], row["gpus_per_node"], row["attempts"]) == (1, 2, 1)
    assert row["plan"]["zero_stage"] in (0, 1, 2, 3) and "ds_config" not in row["plan"]
    admin = auth(tokens["root"])
    every = client.get("/console/api/jobs", headers=admin).json()
    assert {r["team"] for r in every["data"]} == {"vision", "speech"}
    speech = client.get("/console/api/jobs", params={"team": "speech"}, headers=admin).json()
    assert [r["name"] for r in speech["data"]] == ["s-one"]
    asked = client.get(
        "/console/api/jobs", params={"team": "speech"}, headers=auth(tokens["alice"])
    )
    assert [r["team"] for r in asked.json()["data"]] == ["vision"]  # a member sees only theirs


def test_spec_parsing_needs_a_token_and_a_mapping(
    client: TestClient, tokens: dict[str, str]
) -> None:
    text = "name: tiny\nresources: {nodes: 1, gpus_per_node: 2}\n"
    headers = {**auth(tokens["alice"]), "Content-Type": "text/plain"}
    assert client.post("/console/api/spec", content=text, headers=headers).json() == {
        "name": "tiny", "resources": {"nodes": 1, "gpus_per_node": 2},
    }  # fmt: skip
    assert client.post("/console/api/spec", content="- a list", headers=headers).status_code == 422
    bare = {"Content-Type": "text/plain"}
    assert client.post("/console/api/spec", content=text, headers=bare).status_code == 401


def test_the_page_is_served_with_its_policy_and_the_root_leads_to_it(client: TestClient) -> None:
    page = client.get("/console")
    assert page.status_code == 200 and "/console/static/app.js" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/console/static/app.js").status_code == 200
    assert client.get("/", follow_redirects=False).headers["location"] == "/console"


def counted(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_submissions_count_once_and_refusals_not_at_all(
    client: TestClient, tokens: dict[str, str]
) -> None:
    labels = {"cluster": "local", "team": "vision"}
    before = counted("zeropilot_jobs_submitted_total", **labels)
    admitted = counted("zeropilot_jobs_admitted_total", **labels)
    headers = {**auth(tokens["alice"]), "Idempotency-Key": "once"}
    for _ in range(2):  # a retried POST returns the same job
        assert client.post("/v1/jobs", json=tiny_spec("v-once"), headers=headers).status_code in (
            201,
            200,
        )
    refused = client.post(
        "/v1/jobs", json=tiny_spec("v-bad", args=[1]), headers=auth(tokens["alice"])
    )
    assert refused.status_code == 422

    assert counted("zeropilot_jobs_submitted_total", **labels) == before + 1
    assert counted("zeropilot_jobs_admitted_total", **labels) == admitted + 1
    scraped = client.get("/metrics").text
    assert 'zeropilot_queue_depth{team="vision"} 0.0' in scraped
    assert 'zeropilot_team_gpu_quota{team="vision"} 2.0' in scraped
    assert 'zeropilot_jobs{cluster="local",status="QUEUED"} 1.0' in scraped
