"""A cancel that reaches a run after it exited 0, before the service noticed: the run finished.

The run is real (the local backend's supervisor and DeepSpeed's launcher around a script that
exits 0 at once); the cancel goes through the API while the database still says the attempt is
launching, and the reconcile that follows reads the result the supervisor wrote.
"""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from service.core.clusters import LOCAL_PROFILE
from service.settings import Settings
from tests.integration.helpers import auth, tiny_spec
from workers.backends import local
from workers.backends.base import BackendState
from workers.launch import launch_attempt
from workers.reconcile import reconcile_attempt


def test_a_cancel_after_a_clean_exit_says_the_run_finished(
    client: TestClient, settings: Settings, tokens: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "done.py").write_text("print('trained')\n")
    spec = tiny_spec(entrypoint="done.py", working_dir=str(tmp_path), args=[])
    job = client.post("/v1/jobs", json=spec, headers=auth(tokens["alice"])).json()
    attempt_id = job["attempts"][0]["id"]
    launch_attempt(settings, attempt_id)
    ref = str(settings.attempts_dir / job["attempts"][0]["backend_name"])
    deadline = time.monotonic() + 240
    while local.poll(LOCAL_PROFILE, ref).state != BackendState.SUCCEEDED:
        assert time.monotonic() < deadline, "the script did not finish"
        time.sleep(0.5)

    cancel = client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(tokens["alice"]))
    reconcile_attempt(settings, attempt_id)

    assert cancel.status_code == 200 and cancel.json()["status"] == "CANCELLED"
    detail = client.get(f"/v1/jobs/{job['id']}", headers=auth(tokens["alice"])).json()
    (attempt,) = detail["attempts"]
    assert (attempt["status"], attempt["exit_code"]) == ("SUCCEEDED", 0)
    last = [e for e in detail["events"] if e["subject"] == "attempt"][-1]
    assert "had exited 0 before the cancel" in last["reason"]
    assert "the run finished" in last["reason"]
