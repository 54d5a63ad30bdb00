"""checkpoint.interval_steps: auto, through the real API and database: a known save time and a
known interruption history on the cluster give Young's interval, the runtime's metrics report
gets it in its answer, and the job's events say why."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session
from typer.testing import CliRunner

from service.core.attempt_kinds import AttemptKind
from service.core.states import AttemptStatus
from service.db import jobs as job_store
from service.db.models import Job, utcnow
from service.db.session import get_engine
from service.security import attempt_token
from service.settings import Settings
from tests.integration.helpers import auth, tiny_spec
from tests.integration.timeline import TOKENS_PER_STEP, Timeline
from tests.unit.scripted_api import ScriptedApi
from zeropilot.cli import app

HOUR = 3600.0


def submitted(client: TestClient, token: str, name: str, **changes: Any) -> str:
    created = client.post("/v1/jobs", json=tiny_spec(name, **changes), headers=auth(token))
    assert created.status_code == 201, created.text
    job_id: str = created.json()["id"]
    return job_id


def interrupted_twice(settings: Settings, job_id: str) -> None:
    """Another job on the cluster: 10 h then a lost node; 9 h then an NCCL timeout (2 GPUs)."""
    with Session(get_engine(settings.database_url)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        rows = Timeline(session, job, utcnow() - timedelta(days=2), settings.data_dir)
        first = job_store.current_attempt(session, job)
        assert first is not None
        rows.run(first, started=0)
        rows.end(first, AttemptStatus.FAILED, at=10 * HOUR, failure_class="NODE_LOST")
        second = rows.then(first, AttemptKind.DISRUPTION, rows.save(first, 1, 1, 1))
        rows.run(second, started=11 * HOUR)
        rows.end(second, AttemptStatus.FAILED, at=20 * HOUR, failure_class="NCCL_TIMEOUT")
        session.commit()


def running_for_an_hour(settings: Settings, job_id: str) -> str:
    with Session(get_engine(settings.database_url)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        attempt = job_store.current_attempt(session, job)
        assert attempt is not None
        Timeline(session, job, utcnow() - timedelta(hours=1), settings.data_dir).run(attempt, 0)
        session.commit()
        return attempt.id


@pytest.fixture(scope="module")
def auto_job(
    shared_client: TestClient, shared_tokens: dict[str, str], shared_settings: Settings
) -> dict[str, Any]:
    alice = shared_tokens["alice"]
    interrupted_twice(shared_settings, submitted(shared_client, alice, "flaky"))
    job_id = submitted(shared_client, alice, "auto", checkpoint={"interval_steps": "auto"})
    attempt_id = running_for_an_hour(shared_settings, job_id)
    runtime = auth(attempt_token(shared_settings.secret_key(), attempt_id))
    return {"id": job_id, "runtime": runtime, "base": f"/v1/runtime/attempts/{attempt_id}"}


def report_step(client: TestClient, job: dict[str, Any], step: int) -> int:
    point = {"step": step, "tokens_per_s": TOKENS_PER_STEP}  # one step a second
    answer = client.post(f"{job['base']}/metrics/batch", json=[point], headers=job["runtime"])
    assert answer.status_code == 200, answer.text
    interval: int = answer.json()["checkpoint_interval_steps"]
    return interval


def test_auto_learns_the_interval_from_a_measured_save_and_the_clusters_history(
    auto_job: dict[str, Any],
    shared_client: TestClient,
    shared_settings: Settings,
    shared_tokens: dict[str, str],
) -> None:
    # No save measured yet: a first save after 10 minutes, at 1 s a step.
    assert report_step(shared_client, auto_job, 1) == 600
    folder = shared_settings.data_dir / "jobs" / auto_job["id"] / "checkpoints"
    # The second save's median (1.75 s: 355 steps) is within 10% of 379: the interval stays.
    for step, seconds in [(600, 2.0), (700, 1.5), (800, 2.5)]:  # median 2 s
        saved = {"step": step, "path": str(folder / f"global_step{step}"), "seconds": seconds}
        reply = shared_client.post(
            f"{auto_job['base']}/checkpoints", json=saved, headers=auto_job["runtime"]
        )
        assert reply.status_code == 204, reply.text
    # The cluster ran 2 x 19 h + 2 x 1 h = 40 GPU-hours with 2 interruptions: 20 GPU-hours each,
    # a 2-GPU job every 10 h. Young: sqrt(2 x 2 s x 36,000 s) = 379.5 s = 379 steps of 1 s.
    assert report_step(shared_client, auto_job, 801) == 379
    job = shared_client.get(f"/v1/jobs/{auto_job['id']}", headers=auth(shared_tokens["alice"]))
    reasons = [
        e["reason"] for e in job.json()["events"] if e["reason"].startswith("checkpoint every")
    ]
    assert reasons == [
        "checkpoint every 600 steps: a first save after 10 min to time one",
        "checkpoint every 379 steps: a save takes 2 s, this cluster loses a 2-GPU job every 10 h",
    ]


def test_a_set_interval_is_answered_as_set(
    shared_client: TestClient, shared_tokens: dict[str, str], shared_settings: Settings
) -> None:
    job_id = submitted(shared_client, shared_tokens["alice"], "fixed")  # tiny_spec: none set
    attempt_id = running_for_an_hour(shared_settings, job_id)
    job = {
        "runtime": auth(attempt_token(shared_settings.secret_key(), attempt_id)),
        "base": f"/v1/runtime/attempts/{attempt_id}",
    }
    assert report_step(shared_client, job, 1) == 100  # the local cluster's default


def test_a_bad_interval_is_refused_with_its_field(
    shared_client: TestClient, shared_tokens: dict[str, str]
) -> None:
    spec = tiny_spec("bad", checkpoint={"interval_steps": "often"})
    refused = shared_client.post("/v1/jobs", json=spec, headers=auth(shared_tokens["alice"]))
    assert refused.status_code == 422
    assert "give a number of steps (e.g. 100) or 'auto', not 'often'" in refused.text


def test_status_says_how_often_the_job_saves_and_why(
    auto_job: dict[str, Any],
    shared_client: TestClient,
    shared_tokens: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI, given the API's real answer (served as recorded)."""
    job = shared_client.get(f"/v1/jobs/{auto_job['id']}", headers=auth(shared_tokens["alice"]))
    api = ScriptedApi([(200, {}, job.json())])
    try:
        monkeypatch.setenv("ZEROPILOT_URL", api.url)
        monkeypatch.setenv("ZEROPILOT_TOKEN", "zp_t")
        status = CliRunner().invoke(app, ["status", auto_job["id"]], terminal_width=200)
    finally:
        api.server.shutdown()
    assert (
        "checkpoints every 379 steps: a save takes 2 s, this cluster loses a 2-GPU job every 10 h"
        in status.output
    ), status.output
