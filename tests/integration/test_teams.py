"""Team quotas, cluster caps and fair share through the API, on a real database and Redis.

Launches are checked in Celery's queue in Redis; the GPUs a job releases are released here by
cancelling it, and the admission pass the workers run every few seconds is called directly
(``workers.reconcile.reconcile``, what the beat task runs).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.settings import ClusterSettings, Settings
from service.tasks import LAUNCH_ATTEMPT
from tests.integration.helpers import auth, queued_tasks, three_users, tiny_spec
from workers.reconcile import reconcile

CAPPED = {"name": "capped", "kind": "slurm", "gpus_per_node": 2, "max_nodes": 2, "max_gpus": 4}


@pytest.fixture
def capped_settings(settings: Settings, tmp_path: Path) -> Settings:
    """The test settings plus a cluster on which zeropilot admits at most 4 GPUs."""
    profiles = tmp_path / "clusters.yaml"
    profiles.write_text(yaml.safe_dump({"clusters": [CAPPED]}))
    return settings.model_copy(update={"clusters": ClusterSettings(profiles_file=profiles)})


@pytest.fixture
def client(capped_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(capped_settings)) as test_client:
        yield test_client


@pytest.fixture
def tokens(capped_settings: Settings) -> dict[str, str]:
    return three_users(capped_settings.database_url)


def launched(redis_url: str) -> list[str]:
    """Attempt ids of the launch tasks waiting in Celery's queue, oldest first."""
    return [args[0] for task, args in queued_tasks(redis_url) if task == LAUNCH_ATTEMPT]


def submit(client: TestClient, token: str, name: str, **changes: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=tiny_spec(name, **changes), headers=auth(token))
    assert response.status_code == 201, response.text
    return dict(response.json())


def job(client: TestClient, token: str, job_id: str) -> dict[str, Any]:
    return dict(client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json())


def set_quota(client: TestClient, tokens: dict[str, str], team: str, **body: Any) -> Any:
    response = client.patch(f"/v1/teams/{team}", json=body, headers=auth(tokens["root"]))
    assert response.status_code == 200, response.text
    return response.json()


def test_a_job_over_its_teams_quota_waits_until_gpus_are_released(
    client: TestClient, tokens: dict[str, str], capped_settings: Settings, redis_url: str
) -> None:
    set_quota(client, tokens, "vision", gpu_quota=2)  # one tiny job: 1 node x 2 GPUs

    first = submit(client, tokens["alice"], "first")
    second = submit(client, tokens["alice"], "second")
    other_team = submit(client, tokens["bob"], "other-team")

    assert (first["status"], second["status"], other_team["status"]) == (
        "QUEUED", "PENDING", "QUEUED",
    )  # fmt: skip
    assert second["message"] == (
        "waiting: team vision holds 2 of its 2-GPU quota; this job needs 2"
    )
    first_attempt, other_attempt = first["attempts"][0]["id"], other_team["attempts"][0]["id"]
    assert launched(redis_url) == [first_attempt, other_attempt]

    cancel = client.post(f"/v1/jobs/{first['id']}/cancel", headers=auth(tokens["alice"]))
    assert cancel.status_code == 200
    reconcile(capped_settings)  # the workers' periodic pass

    second = job(client, tokens["alice"], second["id"])
    assert second["status"] == "QUEUED" and second["message"] == ""
    assert [e["reason"] for e in second["events"] if e["subject"] == "job"][-1] == "admitted"
    assert launched(redis_url)[-1] == second["attempts"][0]["id"]


def test_a_job_larger_than_its_teams_quota_is_refused_and_nothing_is_stored(
    client: TestClient, tokens: dict[str, str]
) -> None:
    set_quota(client, tokens, "vision", gpu_quota=1)

    response = client.post("/v1/jobs", json=tiny_spec(), headers=auth(tokens["alice"]))

    assert response.status_code == 422
    assert "the job needs 2 GPUs and team vision's quota is 1" in response.text
    assert client.get("/v1/jobs", headers=auth(tokens["alice"])).json()["count"] == 0


def test_on_a_capped_cluster_the_team_holding_less_goes_first(
    client: TestClient, tokens: dict[str, str], capped_settings: Settings
) -> None:
    on_capped = {"resources": {"cluster": "capped", "nodes": 1, "gpus_per_node": 2}}
    vision = [submit(client, tokens["alice"], f"v{i}", **on_capped) for i in range(3)]
    speech = submit(client, tokens["bob"], "s0", **on_capped)  # the youngest
    assert [j["status"] for j in [*vision, speech]] == ["QUEUED", "QUEUED", "PENDING", "PENDING"]
    assert speech["message"] == (
        "waiting: cluster capped has 4 of its 4 GPUs admitted; this job needs 2"
    )

    client.post(f"/v1/jobs/{vision[0]['id']}/cancel", headers=auth(tokens["alice"]))
    reconcile(capped_settings)

    # vision holds 2 GPUs and speech none: speech's job goes before vision's older one.
    assert job(client, tokens["bob"], speech["id"])["status"] == "QUEUED"
    assert job(client, tokens["alice"], vision[2]["id"])["status"] == "PENDING"


def test_teams_show_what_they_hold_and_only_admins_change_them(
    client: TestClient, tokens: dict[str, str], redis_url: str
) -> None:
    set_quota(client, tokens, "vision", gpu_quota=2, gpu_share=3)
    submit(client, tokens["alice"], "holding")
    waiting = submit(client, tokens["alice"], "waiting")

    mine = client.get("/v1/teams", headers=auth(tokens["alice"])).json()
    assert mine == [
        {
            "name": "vision",
            "gpu_quota": 2,
            "gpu_share": 3,
            "gpus_held": 2,
            "gpu_borrow_limit": None,
            "gpus_borrowed": 0,
            "gpus_lent": 0,
            "jobs_waiting": 1,
            "checkpoint_roots": [],
        }
    ]
    everyone = client.get("/v1/teams", headers=auth(tokens["root"])).json()
    assert [team["name"] for team in everyone] == ["ops", "speech", "vision"]

    patch = client.patch("/v1/teams/vision", json={"gpu_quota": 8}, headers=auth(tokens["alice"]))
    assert patch.status_code == 403
    unknown = client.patch("/v1/teams/nope", json={}, headers=auth(tokens["root"]))
    assert unknown.status_code == 404
    zero = client.patch("/v1/teams/vision", json={"gpu_quota": 0}, headers=auth(tokens["root"]))
    assert zero.status_code == 422

    lifted = set_quota(client, tokens, "vision", gpu_quota=None)  # no limit: admitted at once
    assert (lifted["gpu_quota"], lifted["gpu_share"], lifted["jobs_waiting"]) == (None, 3, 0)
    assert launched(redis_url)[-1] == waiting["attempts"][0]["id"]


def test_quota_and_share_must_be_json_integers_and_a_refusal_names_the_field(
    client: TestClient, tokens: dict[str, str]
) -> None:
    root = auth(tokens["root"])
    # Each was coerced before: true to a 1-GPU quota, "8" and 8.0 to 8, true to a share of 1.
    for field, value in [
        ("gpu_quota", True), ("gpu_quota", "8"), ("gpu_quota", 8.0),
        ("gpu_share", True), ("gpu_share", "3"),
    ]:  # fmt: skip
        response = client.patch("/v1/teams/vision", json={field: value}, headers=root)
        assert response.status_code == 422, (field, value, response.text)
        (error,) = response.json()["detail"]
        assert error["loc"] == ["body", field]
        assert error["msg"] == "Input should be a valid integer"

    vision = next(t for t in client.get("/v1/teams", headers=root).json() if t["name"] == "vision")
    assert (vision["gpu_quota"], vision["gpu_share"]) == (None, 1)  # nothing was changed


def test_teams_show_borrowed_and_lent_gpus_and_a_borrow_limit_holds_a_job_back(
    capped_settings: Settings, tokens: dict[str, str]
) -> None:
    scheduling = capped_settings.scheduling.model_copy(update={"borrowing": True})
    sharing = capped_settings.model_copy(update={"scheduling": scheduling})
    with TestClient(create_app(sharing)) as client:
        set_quota(client, tokens, "vision", gpu_quota=2)
        limited = set_quota(client, tokens, "speech", gpu_quota=2, gpu_borrow_limit=2)
        assert limited["gpu_borrow_limit"] == 2
        submitted = [submit(client, tokens["bob"], f"s{i}")["id"] for i in range(3)]
        reconcile(sharing)  # a job past its quota borrows in the admission pass, not at submit
        own, borrower, third = (job(client, tokens["bob"], job_id) for job_id in submitted)

        assert [own["status"], borrower["status"], third["status"]] == [

            "QUEUED", "QUEUED", "PENDING",
        ]  # fmt: skip
        assert (own["borrowing"], borrower["borrowing"]) == (False, True)
        assert third["message"] == (
            "waiting: team speech would borrow 4 GPUs past its 2-GPU quota with this job;"
            " its borrow limit is 2"
        )
        teams = client.get("/v1/teams", headers=auth(tokens["root"])).json()
        shown = {t["name"]: (t["gpus_held"], t["gpus_borrowed"], t["gpus_lent"]) for t in teams}
        assert shown == {"ops": (0, 0, 0), "speech": (4, 2, 0), "vision": (0, 0, 2)}
        scraped = client.get("/metrics").text
        assert 'zeropilot_team_gpus_borrowed{team="speech"} 2.0' in scraped
        assert 'zeropilot_team_gpus_lent{team="vision"} 2.0' in scraped

        never = set_quota(client, tokens, "speech", gpu_borrow_limit=0)  # 0: never borrows
        assert never["gpu_borrow_limit"] == 0
        lifted = set_quota(client, tokens, "speech", gpu_borrow_limit=None)
        assert lifted["gpu_borrow_limit"] is None
        negative = client.patch(
            "/v1/teams/speech", json={"gpu_borrow_limit": -1}, headers=auth(tokens["root"])
        )
        assert negative.status_code == 422
