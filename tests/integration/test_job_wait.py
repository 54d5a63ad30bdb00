"""``GET /v1/jobs/{id}/wait``, the long poll ``zeropilot submit --wait`` follows a job with, on
the real database: held until the job moves past what the caller saw, answered at once for an
ended job, at its timeout when nothing moved, and only for the caller's own team's jobs."""

from __future__ import annotations

import threading
import time
from typing import Any

from fastapi.testclient import TestClient

from service.api.job_progress import METRICS_SETTLE_S
from service.security import attempt_token
from service.settings import Settings
from tests.integration.helpers import auth, tiny_spec


def submitted(client: TestClient, token: str) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=tiny_spec(), headers=auth(token))
    assert response.status_code == 201, response.text
    job: dict[str, Any] = response.json()
    return job


def wait(
    client: TestClient, token: str, job: dict[str, Any], **params: Any
) -> tuple[float, dict[str, Any]]:
    """Seconds the wait was held, and its answer; by default the caller saw the job as given."""
    seen = {"status": job["status"], "events_after": job["events"][-1]["id"], **params}
    started = time.monotonic()
    response = client.get(f"/v1/jobs/{job['id']}/wait", params=seen, headers=auth(token))
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return time.monotonic() - started, answer


def later(seconds: float, action: Any) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def test_a_wait_is_held_until_the_job_moves_then_names_where_it_is(
    client: TestClient, tokens: dict[str, str]
) -> None:
    alice = tokens["alice"]
    job = submitted(client, alice)
    timer = later(0.5, lambda: client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(alice)))
    held, answer = wait(client, alice, job, timeout_s=10)
    timer.join()
    events = client.get(f"/v1/jobs/{job['id']}", headers=auth(alice)).json()["events"]
    assert answer["changed"] and answer["status"] == "CANCELLED"
    assert answer["last_event_id"] == events[-1]["id"] > job["events"][-1]["id"]
    assert 0.5 <= held < 5, "held until the cancel, answered within a few ticks of it"


def test_an_ended_job_answers_at_once_and_an_unmoved_one_at_the_timeout(
    client: TestClient, tokens: dict[str, str]
) -> None:
    alice = tokens["alice"]
    job = submitted(client, alice)
    held, answer = wait(client, alice, job, timeout_s=1)
    assert not answer["changed"] and answer["status"] == job["status"]
    assert answer["last_event_id"] == job["events"][-1]["id"] and answer["last_metric_id"] == 0
    assert held >= 1
    client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(alice))
    ended = client.get(f"/v1/jobs/{job['id']}", headers=auth(alice)).json()
    held, answer = wait(client, alice, ended, timeout_s=20)
    assert answer["changed"] and answer["status"] == "CANCELLED" and held < 5


def test_new_metrics_alone_are_gathered_for_a_second_then_answered(
    client: TestClient, tokens: dict[str, str], settings: Settings
) -> None:
    alice = tokens["alice"]
    job = submitted(client, alice)
    attempt_id = job["attempts"][0]["id"]
    runtime = auth(attempt_token(settings.secret_key(), attempt_id))

    def report(step: int) -> None:
        url = f"/v1/runtime/attempts/{attempt_id}/metrics"
        assert client.post(url, json={"step": step, "loss": 1.0}, headers=runtime).is_success

    timers = [later(0.3, lambda: report(1)), later(0.6, lambda: report(2))]
    held, answer = wait(client, alice, job, timeout_s=10)
    for timer in timers:
        timer.join()
    points = client.get(f"/v1/jobs/{job['id']}/metrics", headers=auth(alice)).json()
    assert answer["changed"] and answer["status"] == job["status"]
    assert answer["last_metric_id"] == points[-1]["id"] and len(points) == 2
    assert 0.3 + METRICS_SETTLE_S <= held < 5, "both points in one answer, a second after the first"


def test_only_the_callers_team_may_wait_and_bad_parameters_are_named(
    client: TestClient, tokens: dict[str, str]
) -> None:
    job = submitted(client, tokens["alice"])
    url = f"/v1/jobs/{job['id']}/wait"
    assert client.get(url, headers=auth(tokens["bob"])).status_code == 404
    assert client.get("/v1/jobs/nosuchjob/wait", headers=auth(tokens["alice"])).status_code == 404
    for params, field in [
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": 26}, "timeout_s"),
        ({"events_after": -1}, "events_after"),
        ({"status": "SLEEPING"}, "status"),
    ]:
        response = client.get(url, params=params, headers=auth(tokens["alice"]))
        assert response.status_code == 422, params
        assert field in response.text
