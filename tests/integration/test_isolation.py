"""What a job of one team can reach through the service: its own log and checkpoints, nothing else.

Each test makes the hostile thing for real on disk (a log swapped for a symbolic link to a
private file of the service's, a checkpoint folder turned into a link to another team's job,
a ``checkpoint.dir`` naming another team's folder) and goes through the API and the launch as
they run: the real routes over a real database, the worker's launch function.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert, update
from sqlmodel import Session, col, func, select

from service.api.routes.runtime import MAX_CHECKPOINTS_PER_ATTEMPT
from service.core.failures import FailureClass
from service.db.models import Attempt, Checkpoint
from service.db.session import get_engine
from service.security import attempt_token
from service.settings import Settings
from tests.integration.helpers import auth, tiny_spec
from workers.launch import launch_attempt

SECRET = "the service's secret key\n"


def submit(client: TestClient, token: str, **changes: Any) -> Any:
    return client.post("/v1/jobs", json=tiny_spec(steps=1, **changes), headers=auth(token))


def report(client: TestClient, settings: Settings, attempt_id: str, path: str, step: int) -> Any:
    token = attempt_token(settings.secret_key(), attempt_id)
    body = {"step": step, "path": path}
    return client.post(
        f"/v1/runtime/attempts/{attempt_id}/checkpoints", json=body, headers=auth(token)
    )


def set_attempt(settings: Settings, attempt_id: str, **values: Any) -> None:
    """What the worker would have recorded (a log path, a resume point): not a status."""
    with Session(get_engine(settings.database_url)) as session:
        session.execute(update(Attempt).where(col(Attempt.id) == attempt_id).values(**values))
        session.commit()


def set_roots(client: TestClient, tokens: dict[str, str], team: str, roots: list[str]) -> Any:
    body = {"checkpoint_roots": roots}
    return client.patch(f"/v1/teams/{team}", json=body, headers=auth(tokens["root"]))


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret.key"
    path.write_text(SECRET)
    path.chmod(0o600)
    return path


def test_a_log_swapped_for_a_link_is_an_error_not_the_file_behind_it(
    client: TestClient, settings: Settings, tokens: dict[str, str], secret: Path
) -> None:
    job = submit(client, tokens["alice"]).json()
    attempt_id = job["attempts"][0]["id"]
    folder = settings.attempts_dir / "zp-isolation-a1"
    folder.mkdir(parents=True)
    log = folder / "node-0.log"
    log.write_text("step 1 loss 5.0\n")
    set_attempt(settings, attempt_id, log_path=str(log))
    url = f"/v1/jobs/{job['id']}/logs"
    before = client.get(url, headers=auth(tokens["alice"]))
    (folder / "swap").symlink_to(secret)
    os.replace(folder / "swap", log)  # what the job's own code did

    answers = [
        client.get(url, headers=auth(tokens["alice"])),
        client.get(url, params={"offset": 0}, headers=auth(tokens["alice"])),
    ]

    assert before.status_code == 200 and before.json()["text"] == "step 1 loss 5.0\n"
    for answer in answers:
        assert answer.status_code == 409, answer.text
        assert f"{log} is a symbolic link; zeropilot does not follow it" in answer.json()["detail"]
        assert SECRET.strip() not in answer.text


def test_a_log_path_outside_the_attempts_folder_is_not_read(
    client: TestClient, settings: Settings, tokens: dict[str, str], secret: Path
) -> None:
    job = submit(client, tokens["alice"]).json()
    set_attempt(settings, job["attempts"][0]["id"], log_path=str(secret))

    answer = client.get(f"/v1/jobs/{job['id']}/logs", headers=auth(tokens["alice"]))

    assert answer.status_code == 409, answer.text
    assert f"is not inside {settings.attempts_dir}" in answer.json()["detail"]


def test_a_checkpoint_dir_outside_the_teams_roots_is_refused_at_submit(
    client: TestClient, settings: Settings, tokens: dict[str, str], tmp_path: Path
) -> None:
    speech = submit(client, tokens["bob"]).json()  # another team's job and its folder
    theirs = settings.data_dir / "jobs" / speech["id"] / "checkpoints"
    for folder in (str(theirs), "/", str(tmp_path / "vision")):
        answer = submit(client, tokens["alice"], checkpoint={"dir": folder})
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"][0]["loc"] == ["body", "checkpoint", "dir"]
        assert "is not inside a checkpoint root of team vision (it has none" in answer.text

    assert set_roots(client, tokens, "vision", [str(tmp_path / "vision")]).status_code == 200
    inside = submit(client, tokens["alice"], checkpoint={"dir": str(tmp_path / "vision/run-1")})
    assert inside.status_code == 201, inside.text


def test_checkpoint_roots_may_not_overlap_the_service_or_another_team(
    client: TestClient, settings: Settings, tokens: dict[str, str], tmp_path: Path
) -> None:
    assert set_roots(client, tokens, "speech", [str(tmp_path / "speech")]).status_code == 200
    refusals = {
        str(settings.data_dir / "jobs"): "overlaps the service's data folder",
        str(tmp_path): "overlaps the service's data folder",  # holds the data folder
        str(tmp_path / "speech" / "shared"): "a checkpoint root of team speech",
        "relative/folder": "is not an absolute path",
    }
    for root, why in refusals.items():
        answer = set_roots(client, tokens, "vision", [root])
        assert answer.status_code == 422, root
        assert answer.json()["detail"][0]["loc"][:2] == ["body", "checkpoint_roots"], root
        assert why in answer.text, root

    kept = client.get("/v1/teams", headers=auth(tokens["root"])).json()
    assert {t["name"]: t["checkpoint_roots"] for t in kept}["vision"] == []


def test_a_report_of_another_teams_checkpoint_is_refused_inside_a_team_root(
    client: TestClient, settings: Settings, tokens: dict[str, str], tmp_path: Path
) -> None:
    set_roots(client, tokens, "vision", [str(tmp_path / "vision")])
    set_roots(client, tokens, "speech", [str(tmp_path / "speech")])
    mine = tmp_path / "vision" / "run-1"
    job = submit(client, tokens["alice"], checkpoint={"dir": str(mine)}).json()
    theirs = tmp_path / "speech" / "run-9" / "global_step9"
    theirs.mkdir(parents=True)
    mine.mkdir(parents=True)
    (mine / "global_step9").symlink_to(theirs)
    attempt_id = job["attempts"][0]["id"]

    refused = [
        report(client, settings, attempt_id, str(p), 9) for p in (theirs, mine / "global_step9")
    ]
    accepted = report(client, settings, attempt_id, str(mine / "global_step10"), 10)

    assert [a.status_code for a in refused] == [422, 422]
    assert accepted.status_code == 204, accepted.text
    set_roots(client, tokens, "vision", [])  # the admin takes the root away: no more reports
    late = report(client, settings, attempt_id, str(mine / "global_step20"), 20)
    assert late.status_code == 422
    assert "no longer inside a checkpoint root of the job's team" in late.text


def test_a_resume_point_that_became_a_link_is_not_resumed_from(
    client: TestClient, settings: Settings, tokens: dict[str, str]
) -> None:
    speech = submit(client, tokens["bob"]).json()
    theirs = settings.data_dir / "jobs" / speech["id"] / "checkpoints"
    (theirs / "global_step10").mkdir(parents=True)
    job = submit(client, tokens["alice"]).json()
    attempt_id = job["attempts"][0]["id"]
    mine = settings.data_dir / "jobs" / job["id"] / "checkpoints"
    (mine / "global_step10").mkdir(parents=True)
    assert report(client, settings, attempt_id, str(mine / "global_step10"), 10).status_code == 204
    # After the report, the job swaps its checkpoint folder for a link to the other team's.
    shutil.rmtree(mine)
    mine.symlink_to(theirs, target_is_directory=True)
    set_attempt(settings, attempt_id, resumed_from=str(mine / "global_step10"))

    launch_attempt(settings, attempt_id)

    detail = client.get(f"/v1/jobs/{job['id']}", headers=auth(tokens["alice"])).json()
    assert detail["status"] == "FAILED"
    assert detail["failure_class"] == FailureClass.LAUNCH_ERROR
    assert f"{mine / 'global_step10'}, no longer lies inside" in detail["message"]
    assert not any(settings.attempts_dir.glob("*/started"))  # nothing was started


def test_an_attempt_records_at_most_so_many_checkpoints(
    client: TestClient, settings: Settings, tokens: dict[str, str]
) -> None:
    job = submit(client, tokens["alice"]).json()
    attempt_id = job["attempts"][0]["id"]
    folder = settings.data_dir / "jobs" / job["id"] / "checkpoints"
    rows = [
        {"job_id": job["id"], "attempt_id": attempt_id, "step": s, "path": f"{folder}/s{s}"}
        for s in range(MAX_CHECKPOINTS_PER_ATTEMPT - 1)
    ]
    with Session(get_engine(settings.database_url)) as session:
        session.execute(insert(Checkpoint), rows)
        session.commit()

    again = report(client, settings, attempt_id, f"{folder}/s5", 5)  # a retried report: one row
    last = report(client, settings, attempt_id, f"{folder}/last", 10_000)
    over = report(client, settings, attempt_id, f"{folder}/over", 10_001)

    assert (again.status_code, last.status_code, over.status_code) == (204, 204, 409)
    assert f"already reported {MAX_CHECKPOINTS_PER_ATTEMPT} checkpoints" in over.text
    with Session(get_engine(settings.database_url)) as session:
        query = select(func.count()).where(Checkpoint.job_id == job["id"])
        assert session.exec(query).one() == MAX_CHECKPOINTS_PER_ATTEMPT


def test_a_submit_without_a_valid_token_is_401_whatever_its_body(
    client: TestClient, tokens: dict[str, str]
) -> None:
    bodies = {  # what is sent, and its Content-Type
        "not a spec": (b'{"name": "x"}', "application/json"),
        "not JSON": (b"{nope", "application/json"),
        "YAML": (b"name: x\n", "text/yaml"),
    }
    callers = {"no token": {}, "unknown token": auth("zp_not-a-token")}
    for body_name, (content, kind) in bodies.items():
        for caller_name, headers in callers.items():
            sent = {"Content-Type": kind, **headers}
            answer = client.post("/v1/jobs", content=content, headers=sent)
            assert answer.status_code == 401, (body_name, caller_name, answer.text)
            assert answer.headers["www-authenticate"] == "Bearer"
        sent = {"Content-Type": kind, **auth(tokens["alice"])}
        known = client.post("/v1/jobs", content=content, headers=sent)
        assert known.status_code == 422, (body_name, known.text)
