"""A poll that fails the same way every tick is logged with its traceback once, then in one
line per tick: a worker's log stays readable while an attempt waits for someone to fix it.

The failure is a real one: a job's cluster taken out of the configuration while its attempt
runs, so the periodic reconcile cannot find the cluster's profile."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlmodel import Session

from service.api.app import create_app
from service.core.states import AttemptStatus
from service.db.models import Attempt
from service.db.session import get_engine
from service.db.transitions import move_attempt
from service.settings import ClusterSettings, Settings
from tests.integration.helpers import auth, three_users, tiny_spec
from workers.reconcile import reconcile

GONE = {"name": "gone", "kind": "slurm", "gpus_per_node": 2, "max_nodes": 2}


def test_a_poll_failing_every_tick_is_logged_in_full_once(
    settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    profiles = tmp_path / "clusters.yaml"
    profiles.write_text(yaml.safe_dump({"clusters": [GONE]}))
    with_gone = settings.model_copy(update={"clusters": ClusterSettings(profiles_file=profiles)})
    token = three_users(settings.database_url)["alice"]
    with TestClient(create_app(with_gone)) as client:
        spec = tiny_spec("orphan", resources={"cluster": "gone", "gpus_per_node": 2})
        response = client.post("/v1/jobs", json=spec, headers=auth(token))
    assert response.status_code == 201, response.text
    attempt_id = response.json()["attempts"][0]["id"]
    with Session(get_engine(settings.database_url)) as session:  # as a launch would leave it
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        move_attempt(session, attempt, AttemptStatus.QUEUED, AttemptStatus.LAUNCHING, "test",
                     backend_ref="4242")  # fmt: skip
        session.commit()

    with caplog.at_level(logging.WARNING, logger="workers.reconcile"):
        for _ in range(3):  # three ticks with the cluster gone from the configuration
            reconcile(settings)
    about = [r for r in caplog.records if attempt_id in r.getMessage()]

    assert [r.exc_info is not None for r in about] == [True, False, False]
    assert "KeyError: 'gone'" in about[1].getMessage()
    assert "still failing" in about[2].getMessage()
