"""The HTTP API over a real database and a real Redis broker.

Auth, team scoping, validation errors, idempotency, runtime reports.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.security import attempt_token
from service.settings import BrokerSettings, Settings
from service.tasks import CANCEL_ATTEMPT, LAUNCH_ATTEMPT
from tests.integration.helpers import auth, queued_tasks, tiny_spec


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}


def test_requests_need_a_known_token(client: TestClient) -> None:
    assert client.get("/v1/jobs").status_code == 401
    response = client.get("/v1/jobs", headers=auth("zp_not-a-token"))
    assert response.status_code == 401
    assert "unknown" in response.json()["detail"]


def test_submit_stores_plan_and_enqueues_launch_after_commit(
    client: TestClient, tokens: dict[str, str], redis_url: str
) -> None:
    response = client.post("/v1/jobs", json=tiny_spec(), headers=auth(tokens["alice"]))
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["status"] == "QUEUED" and job["team"] == "vision"
    assert job["plan"]["ds_config"]["train_batch_size"] == 8
    attempt = job["attempts"][0]
    assert attempt["plan"] == job["plan"]
    assert queued_tasks(redis_url) == [(LAUNCH_ATTEMPT, [attempt["id"]])]


def test_the_submit_answers_the_job_exactly_as_it_reads_back(
    client: TestClient, tokens: dict[str, str]
) -> None:
    """The answer is built from the rows as written (not read back): reading the job back
    gives the same document, ids, timestamps, JSON and event order included."""
    response = client.post("/v1/jobs", json=tiny_spec(), headers=auth(tokens["alice"]))
    assert response.status_code == 201, response.text
    answered = response.json()
    stored = client.get(f"/v1/jobs/{answered['id']}", headers=auth(tokens["alice"])).json()
    assert stored == answered
    assert [event["reason"] for event in stored["events"]] == [
        "submitted by alice",
        "attempt 1 planned (advisor)",
        "admitted",
    ]


def test_a_submit_while_the_broker_is_down_is_stored_and_left_to_the_sweep(
    settings: Settings, tokens: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Redis refusing connections: the job is stored and answered as usual (the reconcile
    sweep sends launches left without progress), and the log says why nothing was sent."""
    down = settings.model_copy(update={"broker": BrokerSettings(url="redis://127.0.0.1:1/0")})
    with TestClient(create_app(down)) as client:
        response = client.post("/v1/jobs", json=tiny_spec(), headers=auth(tokens["alice"]))
        assert response.status_code == 201, response.text
        job = client.get(f"/v1/jobs/{response.json()['id']}", headers=auth(tokens["alice"]))
    assert job.json()["status"] == "QUEUED"
    attempt = response.json()["attempts"][0]["id"]
    assert f"could not enqueue {LAUNCH_ATTEMPT} for attempt {attempt}" in caplog.text
    assert "Connection refused" in caplog.text


def test_idempotency_key_returns_the_same_job(
    client: TestClient, tokens: dict[str, str], redis_url: str
) -> None:
    headers = {**auth(tokens["alice"]), "Idempotency-Key": "abc-123"}
    first = client.post("/v1/jobs", json=tiny_spec(), headers=headers)
    again = client.post("/v1/jobs", json=tiny_spec(), headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert len(queued_tasks(redis_url)) == 1  # one launch, not two
    changed = client.post("/v1/jobs", json=tiny_spec("other"), headers=headers)
    assert changed.status_code == 409
    assert "different spec" in changed.json()["detail"]


@pytest.mark.parametrize(
    "change,field,words",
    [
        ({"name": "Bad_Name"}, "name", "should match pattern"),
        (
            {"resources": {"cluster": "nowhere", "gpus_per_node": 2}},
            "resources.cluster",
            "unknown cluster 'nowhere'",
        ),
        ({"resources": {"nodes": 4, "gpus_per_node": 2}}, "resources.nodes", "at most 2 nodes"),
        (
            {"training": {"sequence_length": 32, "global_batch_size": 7}},
            "training.global_batch_size",
            "not divisible by the data-parallel size",
        ),
        ({"team": "speech"}, "team", "you belong to team 'vision'"),
    ],
)
def test_bad_input_is_422_naming_the_field_and_stores_nothing(
    client: TestClient,
    tokens: dict[str, str],
    redis_url: str,
    change: dict[str, Any],
    field: str,
    words: str,
) -> None:
    response = client.post("/v1/jobs", json=tiny_spec(**change), headers=auth(tokens["alice"]))
    assert response.status_code == 422
    detail = response.json()["detail"]
    named = [
        d for d in detail if ".".join(map(str, d["loc"][1:])).startswith(field) or field in d["msg"]
    ]
    assert any(words in d["msg"] for d in named), detail
    assert client.get("/v1/jobs", headers=auth(tokens["alice"])).json()["count"] == 0
    assert queued_tasks(redis_url) == []


def test_more_gpus_per_node_than_the_cluster_has_is_refused_naming_resources(
    client: TestClient, tokens: dict[str, str]
) -> None:
    wide = tiny_spec(resources={"cluster": "local", "gpus_per_node": 4})
    response = client.post("/v1/jobs", json=wide, headers=auth(tokens["alice"]))

    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "resources"]  # not zero.overrides: the user set none
    assert "resources.gpus_per_node (4) exceeds the 2 per node that cluster 'local'" in error["msg"]


def test_other_teams_jobs_are_not_found(client: TestClient, tokens: dict[str, str]) -> None:
    job = client.post("/v1/jobs", json=tiny_spec(), headers=auth(tokens["alice"])).json()
    for path in ("", "/logs", "/metrics", "/checkpoints"):
        assert (
            client.get(f"/v1/jobs/{job['id']}{path}", headers=auth(tokens["bob"])).status_code
            == 404
        )
    assert (
        client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(tokens["bob"])).status_code == 404
    )
    assert client.get("/v1/jobs", headers=auth(tokens["bob"])).json()["count"] == 0
    admin_view = client.get(f"/v1/jobs/{job['id']}", headers=auth(tokens["root"]))
    assert admin_view.status_code == 200
    other = client.get("/v1/jobs?team=vision", headers=auth(tokens["bob"]))
    assert other.status_code == 403


def test_cancel_moves_to_cancelled_once_and_enqueues_the_stop(
    client: TestClient, tokens: dict[str, str], redis_url: str
) -> None:
    job = client.post("/v1/jobs", json=tiny_spec(), headers=auth(tokens["alice"])).json()
    response = client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(tokens["alice"]))
    assert response.json()["status"] == "CANCELLED"
    again = client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(tokens["alice"]))
    assert again.status_code == 409
    attempt_id = job["attempts"][0]["id"]
    assert queued_tasks(redis_url)[-1] == (CANCEL_ATTEMPT, [attempt_id])
    events = client.get(f"/v1/jobs/{job['id']}", headers=auth(tokens["alice"])).json()["events"]
    assert events[-1]["to_status"] == "CANCELLED" and "alice" in events[-1]["reason"]


def test_runtime_reports_need_the_attempts_own_token(
    client: TestClient, tokens: dict[str, str], settings: Settings
) -> None:
    job = client.post("/v1/jobs", json=tiny_spec(), headers=auth(tokens["alice"])).json()
    attempt_id = job["attempts"][0]["id"]
    url = f"/v1/runtime/attempts/{attempt_id}"
    good = auth(attempt_token(settings.secret_key(), attempt_id))
    wrong = auth(attempt_token(settings.secret_key(), "someotherattempt"))
    assert (
        client.post(f"{url}/metrics", json={"step": 1, "loss": 2.5}, headers=wrong).status_code
        == 401
    )
    assert (
        client.post(
            f"{url}/metrics", json={"step": 1, "loss": 2.5}, headers=auth(tokens["alice"])
        ).status_code
        == 401
    )
    for step, loss in ((1, 2.5), (2, 2.0), (2, 1.9)):
        assert (
            client.post(
                f"{url}/metrics", json={"step": step, "loss": loss}, headers=good
            ).status_code
            == 204
        )
    folder = settings.data_dir / "jobs" / job["id"] / "checkpoints"  # ZEROPILOT_CHECKPOINT_DIR
    checkpoint = {"step": 2, "path": str(folder / "global_step2"), "tag": "global_step2"}
    assert client.post(f"{url}/checkpoints", json=checkpoint, headers=good).status_code == 204
    failure = {"failure_class": "OOM_GPU", "message": "CUDA out of memory"}
    assert client.post(f"{url}/failure", json=failure, headers=good).status_code == 204
    detail = client.get(f"/v1/jobs/{job['id']}", headers=auth(tokens["alice"])).json()
    assert [(m["step"], m["loss"]) for m in detail["metrics"]] == [(1, 2.5), (2, 1.9)]
    assert detail["checkpoints"][0]["path"] == str(folder / "global_step2")
    assert "OOM_GPU" in detail["events"][-1]["reason"]


def test_admin_creates_users_and_others_cannot(client: TestClient, tokens: dict[str, str]) -> None:
    body = {"name": "carol", "team": "vision"}
    assert client.post("/v1/users", json=body, headers=auth(tokens["alice"])).status_code == 403
    created = client.post("/v1/users", json=body, headers=auth(tokens["root"]))
    assert created.status_code == 201
    me = client.get("/v1/me", headers=auth(created.json()["token"])).json()
    assert me == {"name": "carol", "team": "vision", "is_admin": False, "role": "member"}
    assert client.post("/v1/users", json=body, headers=auth(tokens["root"])).status_code == 409


def test_advice_needs_a_user_and_knows_the_configured_clusters(
    client: TestClient, tokens: dict[str, str]
) -> None:
    assert client.post("/v1/advice", json=tiny_spec()).status_code == 401
    response = client.post("/v1/advice", json=tiny_spec(), headers=auth(tokens["alice"]))
    assert response.status_code == 200, response.text
    advice = response.json()
    assert advice["plan"] in advice["candidates"]
    assert advice["plan"]["ds_config"]["train_batch_size"] == 8
    elsewhere = tiny_spec(resources={"cluster": "nowhere", "gpus_per_node": 2})
    unknown = client.post("/v1/advice", json=elsewhere, headers=auth(tokens["alice"]))
    assert unknown.status_code == 422


def test_docs_page_loads_its_assets_from_this_server(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sources and all(s.startswith("/") for s in sources), sources  # no CDN: offline works
    for source in sources:
        asset = client.get(source)
        assert asset.status_code == 200 and len(asset.content) > 500, source
    assert "SwaggerUIBundle" in client.get("/docs-assets/swagger-ui-bundle.js").text
    assert client.get("/openapi.json").json()["info"]["title"] == "zeropilot"


def test_refusals_quote_the_rule_without_pydantic_prefixes(
    client: TestClient, tokens: dict[str, str]
) -> None:
    spec = tiny_spec(training={"sequence_length": 32, "global_batch_size": 7})
    response = client.post("/v1/jobs", json=spec, headers=auth(tokens["alice"]))
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["msg"].startswith("training.global_batch_size (7) is not divisible by")
