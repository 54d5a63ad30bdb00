"""A launch that keeps failing ends the attempt after a bounded number of tries, through a real
API and a real Celery worker: the job is FAILED / LAUNCH_ERROR with the real reason, the worker
logs one line per try and no traceback, and the team's GPUs are free again for its next job."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from service.db.migrate import upgrade
from service.db.session import get_engine
from service.db.users import create_user
from service.settings import Settings
from tests.e2e.stack import Api, Stack
from tests.integration.helpers import auth, tiny_spec
from workers.launch import launch_attempt

pytestmark = pytest.mark.slow

TRIES = 3


@pytest.fixture
def stack(tmp_path: Path, postgres_url: str, redis_url: str) -> Iterator[Stack]:
    upgrade(postgres_url)
    running = Stack(tmp_path / "data", postgres_url, redis_url)
    running.start_api()
    running.start_worker(
        "w1", launch_max_tries=str(TRIES), launch_retry_delay_s="1", launch_lease_s="5"
    )
    yield running
    running.stop()


def deep_working_dir(root: Path) -> Path:
    """A real folder whose path (3,950 bytes) is within every limit, but with a long entrypoint
    joined to it no longer fits in PATH_MAX (4,096): stat() fails with ENAMETOOLONG."""
    folder = root
    while (room := 3_950 - len(os.fsencode(folder)) - 1) > 0:
        folder = folder / ("d" * min(200, room))
    folder.mkdir(parents=True)
    return folder


def test_a_launch_error_ends_the_attempt_after_its_tries_and_frees_the_quota(
    stack: Stack, postgres_url: str, tmp_path: Path
) -> None:
    with Session(get_engine(postgres_url)) as session:
        alice = create_user(session, "alice", "vision")
        root = create_user(session, "root", "ops", is_admin=True)
        session.commit()
    Api(stack.url, root).http.patch("/v1/teams/vision", json={"gpu_quota": 2})
    api = Api(stack.url, alice)
    entrypoint = "e" * 200 + ".py"
    doomed = api.submit(
        tiny_spec("doomed", working_dir=str(deep_working_dir(tmp_path)), entrypoint=entrypoint)
    )
    waiting = api.submit(tiny_spec("waiting", entrypoint="no_such_script.py"))

    failed = api.wait_for(doomed["id"], {"FAILED", "SUCCEEDED"}, stack, timeout_s=180)

    attempt = failed["attempts"][0]
    assert (failed["status"], failed["failure_class"]) == ("FAILED", "LAUNCH_ERROR")
    assert attempt["failure_class"] == "LAUNCH_ERROR"
    assert "OSError: [Errno 36] File name too long" in attempt["failure_message"]
    assert f"(launch tried {TRIES} times)" in attempt["failure_message"]
    assert attempt["launch_tries"] == TRIES
    # Its two GPUs are the whole quota: the next job is admitted only once they are free.
    second = api.wait_for(waiting["id"], {"FAILED", "SUCCEEDED"}, stack, timeout_s=180)
    assert "entrypoint 'no_such_script.py' not found" in second["message"]

    log = (stack.data_dir / "worker-w1.log").read_text()
    lines = [line for line in log.splitlines() if attempt["id"] in line]
    retries = [line for line in lines if "next try in" in line]
    assert [f"(try {n} of {TRIES})" in line for n, line in enumerate(retries, 1)] == [True] * 2
    assert len([line for line in lines if "launch of attempt" in line]) == TRIES
    assert "Traceback" not in log
    assert max(len(line) for line in log.splitlines()) < 2_000  # no kilobyte paths in the log


def test_a_launch_that_cannot_even_render_is_counted_the_same_way(
    settings: Settings, client: TestClient, tokens: dict[str, str]
) -> None:
    job = client.post("/v1/jobs", json=tiny_spec(), headers=auth(tokens["alice"])).json()
    attempt_id = job["attempts"][0]["id"]
    settings.attempts_dir.parent.mkdir(parents=True, exist_ok=True)
    settings.attempts_dir.write_text("")  # a file where the attempts folder must be

    waits = [launch_attempt(settings, attempt_id) for _ in range(TRIES)]

    assert waits == [5.0, 5.0, None]  # 5 s, then doubled but capped at the 5 s lease; then done
    ended = client.get(f"/v1/jobs/{job['id']}", headers=auth(tokens["alice"])).json()
    assert (ended["status"], ended["failure_class"]) == ("FAILED", "LAUNCH_ERROR")
    assert ended["message"].startswith("FileExistsError: [Errno 17] File exists")
    assert launch_attempt(settings, attempt_id) is None  # a late re-send finds nothing to do
