"""The reconcile pass over many attempts: one pass at a time across workers (the lease row in
the real database), every attempt of a cluster from one ``poll_many``, the metrics by backend,
and a pass longer than its interval logged with its counts.

The attempts are local ones whose folders hold what the local supervisor writes (``result.json``
with the ranks' exit codes, or nothing yet while it starts): the pass reads them through the
real local backend; no training runs.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from sqlmodel import Session

from service.core.states import AttemptStatus, JobStatus
from service.db.models import Attempt, Job
from service.db.reconcile_lease import release_lease, take_lease
from service.db.session import get_engine
from service.db.transitions import move_attempt, move_job
from service.settings import Settings, WorkerSettings
from tests.integration.helpers import auth, tiny_spec
from workers.reconcile import reconcile


def launched(client: TestClient, settings: Settings, token: str, result: dict | None) -> str:
    """A job whose attempt the launch handed to the local backend; ``result`` is what its
    supervisor wrote (None: it has not started yet). Returns the job id."""
    job = client.post("/v1/jobs", json=tiny_spec(), headers=auth(token)).json()
    folder = settings.attempts_dir / job["attempts"][0]["backend_name"]
    folder.mkdir(parents=True)
    if result is not None:
        (folder / "result.json").write_text(json.dumps(result))
    with Session(get_engine(settings.database_url)) as session:
        stored = session.get(Job, job["id"])
        attempt = session.get(Attempt, job["attempts"][0]["id"])
        assert stored is not None and attempt is not None
        move_job(session, stored, JobStatus.QUEUED, JobStatus.LAUNCHING, "test: launched")
        move_attempt(session, attempt, AttemptStatus.QUEUED, AttemptStatus.LAUNCHING,
                     "test: launched", backend_ref=str(folder))  # fmt: skip
        session.commit()
    return str(job["id"])


def status_of(client: TestClient, token: str, job_id: str) -> str:
    return str(client.get(f"/v1/jobs/{job_id}", headers=auth(token)).json()["status"])


def polled(backend: str) -> float:
    name = "zeropilot_reconcile_attempts_polled_sum"
    value = REGISTRY.get_sample_value(name, {"backend": backend})
    return value or 0.0


def test_a_pass_waits_for_the_lease_another_worker_holds(
    client: TestClient, settings: Settings, tokens: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    job_id = launched(client, settings, tokens["alice"], {"exit_codes": {"0": 0}})
    with Session(get_engine(settings.database_url)) as session:
        assert take_lease(session, "other-worker", time.time(), 60.0)
        session.commit()

    with caplog.at_level(logging.INFO, logger="workers.reconcile"):
        reconcile(settings)  # another worker's pass is running
    skipped = status_of(client, tokens["alice"], job_id)
    with Session(get_engine(settings.database_url)) as session:
        release_lease(session, "other-worker")  # that pass ended
        session.commit()
    reconcile(settings)

    assert skipped == "LAUNCHING"
    assert any("another worker's pass holds the lease" in r.getMessage() for r in caplog.records)
    assert status_of(client, tokens["alice"], job_id) == "SUCCEEDED"


def test_a_lease_left_by_a_lost_worker_lapses(
    client: TestClient, settings: Settings, tokens: dict[str, str]
) -> None:
    job_id = launched(client, settings, tokens["alice"], {"exit_codes": {"0": 0}})
    with Session(get_engine(settings.database_url)) as session:  # taken 61 s ago for 60 s
        assert take_lease(session, "lost-worker", time.time() - 61.0, 60.0)
        session.commit()

    reconcile(settings)

    assert status_of(client, tokens["alice"], job_id) == "SUCCEEDED"


def test_one_pass_applies_every_attempt_and_counts_them_by_backend(
    client: TestClient, settings: Settings, tokens: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    results = [{"exit_codes": {"0": 0}}, {"exit_codes": {"0": 3}}, None] * 3
    jobs = [launched(client, settings, tokens["alice"], result) for result in results]
    before = polled("local")
    # An interval no pass can keep: the warning with its counts is written.
    hurried = settings.model_copy(update={"workers": WorkerSettings(reconcile_interval_s=1e-6)})

    with caplog.at_level(logging.WARNING, logger="workers.reconcile"):
        reconcile(hurried)

    statuses = [status_of(client, tokens["alice"], job_id) for job_id in jobs]
    assert statuses == ["SUCCEEDED", "FAILED", "LAUNCHING"] * 3
    assert polled("local") - before == 9
    waiting = [
        client.get(f"/v1/jobs/{j}", headers=auth(tokens["alice"])).json() for j in jobs[2::3]
    ]
    # the three pending reasons, written together in one statement
    assert {job["attempts"][0]["native_state"] for job in waiting} == {"starting"}
    (overrun,) = [r.getMessage() for r in caplog.records if "over its" in r.getMessage()]
    assert "9 attempts on 1 clusters polled with 0 cluster calls (local: 9 in" in overrun
