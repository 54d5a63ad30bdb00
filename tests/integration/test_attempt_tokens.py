"""An attempt's runtime token: kept in files only its service user can read, accepted only while
the attempt lasts, and good for checkpoints inside the attempt's checkpoint folder only."""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from service.core.states import AttemptStatus, JobStatus
from service.db.models import Attempt, Job
from service.db.session import get_engine
from service.db.transitions import move_attempt, move_job
from service.security import attempt_token
from service.settings import Settings
from tests.integration.helpers import auth, tiny_spec
from tests.integration.slurm_fixtures import LocalSlurm, launch_request, slurm_profile
from workers.backends import local, slurm
from workers.launch import launch_attempt


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A umask that takes nothing away: a file not created with its own mode shows 0666."""
    before = os.umask(0)
    yield
    os.umask(before)


@pytest.fixture
def job(client: TestClient, tokens: dict[str, str]) -> dict[str, Any]:
    answer = client.post("/v1/jobs", json=tiny_spec(steps=1), headers=auth(tokens["alice"]))
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created


def report(
    client: TestClient, settings: Settings, attempt_id: str, kind: str, body: dict[str, Any]
) -> Any:
    token = attempt_token(settings.secret_key(), attempt_id)
    url = f"/v1/runtime/attempts/{attempt_id}/{kind}"
    return client.post(url, json=body, headers=auth(token))


def test_the_local_launch_writes_the_token_into_private_files_only(
    settings: Settings, job: dict[str, Any], open_umask: None
) -> None:
    attempt_id = job["attempts"][0]["id"]
    launch_attempt(settings, attempt_id)  # the worker's own launch: render, spawn supervisor
    with Session(get_engine(settings.database_url)) as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.backend_ref is not None
        folder = Path(attempt.backend_ref)
    try:
        token = attempt_token(settings.secret_key(), attempt_id)
        assert token in (folder / "launch.json").read_text()
        assert mode(settings.attempts_dir) == mode(folder) == 0o700
        assert mode(folder / "launch.json") == mode(folder / "ds_config.json") == 0o600
        holding = [p.name for p in folder.iterdir() if p.is_file() and token in p.read_text()]
        assert holding == ["launch.json"]
    finally:
        local.cancel(settings.cluster_profiles()["local"], str(folder))
        while not (folder / "result.json").exists() and (folder / "started").exists():
            time.sleep(0.5)  # the supervisor stops its launcher and records the codes


@pytest.mark.slow
def test_the_slurm_scripts_are_private_from_the_start(
    slurm_cluster: LocalSlurm, tmp_path: Path, open_umask: None
) -> None:
    profile = slurm_profile(slurm_cluster)
    token = "zpa_" + "7" * 64
    request = launch_request(
        tmp_path, profile, name="private-a1", entrypoint="examples/train_tiny.py",
        env={"ZEROPILOT_ATTEMPT_TOKEN": token},
    )  # fmt: skip
    request = dataclasses.replace(request, attempt_dir=tmp_path / "attempts" / "private-a1")

    ref = slurm.submit(request)
    try:
        folder = request.attempt_dir
        assert mode(folder) == 0o700
        node_script = folder / slurm.NODE_SCRIPT
        assert f"export ZEROPILOT_ATTEMPT_TOKEN={token}" in node_script.read_text()
        assert mode(node_script) == mode(folder / slurm.BATCH_SCRIPT) == 0o600
    finally:
        slurm.cancel(profile, ref, grace_s=0)


def test_a_token_expires_when_its_attempt_ends(
    client: TestClient, settings: Settings, job: dict[str, Any]
) -> None:
    attempt_id = job["attempts"][0]["id"]
    assert report(client, settings, attempt_id, "metrics", {"step": 1}).status_code == 204
    with Session(get_engine(settings.database_url)) as session:
        stored_job, attempt = session.get(Job, job["id"]), session.get(Attempt, attempt_id)
        assert stored_job is not None and attempt is not None
        move_job(session, stored_job, JobStatus.QUEUED, JobStatus.LAUNCHING, "test launch")
        move_attempt(session, attempt, AttemptStatus.QUEUED, AttemptStatus.LAUNCHING, "launch")
        move_attempt(session, attempt, AttemptStatus.LAUNCHING, AttemptStatus.FAILED, "ended")
        session.commit()

    late = report(client, settings, attempt_id, "metrics", {"step": 2})

    assert late.status_code == 401
    assert late.json()["detail"] == (
        f"attempt token expired: attempt 1 of job {job['id']} ended FAILED; "
        "reports are no longer accepted"
    )


def test_a_token_expires_when_its_job_is_cancelled(
    client: TestClient, settings: Settings, tokens: dict[str, str], job: dict[str, Any]
) -> None:
    attempt_id = job["attempts"][0]["id"]
    cancel = client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(tokens["alice"]))
    assert cancel.status_code == 200, cancel.text

    late = report(client, settings, attempt_id, "checkpoints", {"step": 1, "path": "/x"})

    assert late.status_code == 401
    assert f"job {job['id']} was cancelled" in late.json()["detail"]
    detail = client.get(f"/v1/jobs/{job['id']}", headers=auth(tokens["alice"])).json()
    assert detail["checkpoints"] == []


def test_a_checkpoint_must_lie_inside_the_attempts_checkpoint_folder(
    client: TestClient, settings: Settings, tokens: dict[str, str], job: dict[str, Any],
    tmp_path: Path,
) -> None:  # fmt: skip
    attempt_id = job["attempts"][0]["id"]
    folder = settings.data_dir / "jobs" / job["id"] / "checkpoints"  # its ZEROPILOT_CHECKPOINT_DIR
    elsewhere = tmp_path / "other-team" / "checkpoints" / "global_step9"
    elsewhere.mkdir(parents=True)
    folder.mkdir(parents=True)
    (folder / "global_step9").symlink_to(elsewhere)  # a real link, leading out of the folder
    outside = {
        "dot-dot": f"{folder}/../../{job['id']}x/checkpoints/global_step9",
        "symlink": str(folder / "global_step9"),
        "another folder": str(elsewhere),
        "relative": "checkpoints/global_step9",
    }
    refused = {
        why: report(client, settings, attempt_id, "checkpoints", {"step": 9, "path": path})
        for why, path in outside.items()
    }
    inside = {"step": 10, "path": f"{folder}/sub/../global_step10", "tag": "global_step10"}
    accepted = report(client, settings, attempt_id, "checkpoints", inside)

    for why, answer in refused.items():
        assert answer.status_code == 422, why
        (error,) = answer.json()["detail"]
        assert error["loc"] == ["body", "path"], why
        assert f"must lie inside the attempt's checkpoint folder {folder}" in error["msg"], why
    assert accepted.status_code == 204, accepted.text
    detail = client.get(f"/v1/jobs/{job['id']}", headers=auth(tokens["alice"])).json()
    assert [c["step"] for c in detail["checkpoints"]] == [10]
