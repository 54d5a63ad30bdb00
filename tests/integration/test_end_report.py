"""An attempt's end, reported as it happens: the route sends one task per attempt, only with
the attempt's own token, and the task records the end without waiting for the next pass."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlmodel import Session

from service.core.states import AttemptStatus
from service.db.models import Attempt
from service.db.session import get_engine
from service.db.transitions import move_attempt
from service.security import attempt_token
from service.settings import Settings
from service.tasks import ATTEMPT_ENDED
from tests.integration.helpers import auth, queued_tasks, tiny_spec
from workers.backends.local_supervisor import report_end


def submitted(client: TestClient, tokens: dict[str, str]) -> dict[str, Any]:
    answer = client.post("/v1/jobs", json=tiny_spec(steps=1), headers=auth(tokens["alice"]))
    assert answer.status_code == 201, answer.text
    job: dict[str, Any] = answer.json()
    return job


def ended(client: TestClient, attempt_id: str, token: str | None) -> Any:
    headers = auth(token) if token else {}
    return client.post(f"/v1/runtime/attempts/{attempt_id}/ended", headers=headers)


def test_an_end_report_sends_one_task_however_often_it_comes(
    client: TestClient, tokens: dict[str, str], settings: Settings, redis_url: str
) -> None:
    attempt_id = submitted(client, tokens)["attempts"][0]["id"]
    token = attempt_token(settings.secret_key(), attempt_id)

    answers = [ended(client, attempt_id, token).status_code for _ in range(3)]

    assert answers == [202, 202, 202]
    sent = [args for name, args in queued_tasks(redis_url) if name == ATTEMPT_ENDED]
    assert sent == [[attempt_id]]


def test_an_end_report_needs_the_attempts_own_live_token(
    client: TestClient, tokens: dict[str, str], settings: Settings, redis_url: str
) -> None:
    first, second = (submitted(client, tokens)["attempts"][0]["id"] for _ in range(2))
    assert ended(client, first, None).status_code == 401
    other = attempt_token(settings.secret_key(), second)
    assert ended(client, first, other).status_code == 401  # another attempt's token
    with Session(get_engine(settings.database_url)) as session:
        attempt = session.get(Attempt, first)
        assert attempt is not None
        move_attempt(session, attempt, AttemptStatus.QUEUED, AttemptStatus.CANCELLED, "test")
        session.commit()
    late = ended(client, first, attempt_token(settings.secret_key(), first))
    assert late.status_code == 401 and "no longer accepted" in late.json()["detail"]
    assert [n for n, _ in queued_tasks(redis_url) if n == ATTEMPT_ENDED] == []


def test_the_supervisor_reports_nothing_without_a_service_to_tell() -> None:
    assert report_end({}) is False
    assert report_end({"ZEROPILOT_URL": "file:///etc/passwd", "ZEROPILOT_ATTEMPT_ID": "a",
                       "ZEROPILOT_ATTEMPT_TOKEN": "t"}) is False  # fmt: skip
    closed = {"ZEROPILOT_URL": "http://127.0.0.1:9", "ZEROPILOT_ATTEMPT_ID": "a",
              "ZEROPILOT_ATTEMPT_TOKEN": "t"}  # fmt: skip
    assert report_end(closed) is False  # refused: the pass will see the end
