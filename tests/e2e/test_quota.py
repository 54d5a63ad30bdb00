"""A team quota through real processes: the second job waits, then the worker's beat admits it."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlmodel import Session, select

from service.db.models import Team
from service.db.session import get_engine
from tests.e2e.stack import Api, Stack
from tests.integration.helpers import tiny_spec

pytestmark = pytest.mark.slow


def test_a_job_over_the_quota_starts_when_the_first_finishes(
    stack: Stack, api: Api, postgres_url: str
) -> None:
    with Session(get_engine(postgres_url)) as session:  # what `zeropilot teams set` does
        team = session.exec(select(Team).where(Team.name == "vision")).one()
        team.gpu_quota = 2  # one tiny job: 1 node x 2 ranks
        session.add(team)
        session.commit()
    stack.start_worker("w1")

    first = api.submit(tiny_spec("first", steps=10))
    second = api.submit(tiny_spec("second", steps=10))
    assert (first["status"], second["status"]) == ("QUEUED", "PENDING")

    first = api.wait_for(first["id"], {"SUCCEEDED", "FAILED"}, stack)
    second = api.wait_for(second["id"], {"SUCCEEDED", "FAILED"}, stack)

    assert (first["status"], second["status"]) == ("SUCCEEDED", "SUCCEEDED"), second["message"]
    admitted = next(
        e for e in second["events"] if e["subject"] == "job" and e["to_status"] == "QUEUED"
    )
    assert admitted["reason"] == "admitted"
    # Not before the GPUs were free:
    assert at(admitted["created_at"]) >= at(first["finished_at"])


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
