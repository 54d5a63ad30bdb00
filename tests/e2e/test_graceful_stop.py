"""A cancel stops a run gracefully: SIGTERM, the ranks save the step they reached, then exit.

Real processes throughout: the API (uvicorn), a Celery worker, the local backend's supervisor,
DeepSpeed's launcher and two gloo ranks of ``examples/train_tiny.py``; the cancel goes over HTTP.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import Api, Stack
from tests.e2e.test_cli import zeropilot
from tests.integration.helpers import tiny_spec

pytestmark = pytest.mark.slow


def long_run(name: str, *extra: str, **changes: Any) -> dict[str, Any]:
    """Far more steps than the test waits for, and no interval checkpoint to fall back on."""
    spec = tiny_spec(name, steps=100_000, **changes)
    return {**spec, "args": ["--steps", "100000", "--checkpoint-interval", "100000", *extra]}


def wait_for_steps(api: Api, job_id: str, steps: int, stack: Stack) -> None:
    deadline = time.monotonic() + 300
    while len(api.http.get(f"/v1/jobs/{job_id}/metrics").json()) < steps:
        assert time.monotonic() < deadline, f"no {steps} steps:\n{stack.logs()}"
        time.sleep(0.5)


def cancel_and_wait(api: Api, job_id: str, stack: Stack) -> dict[str, Any]:
    cancel = api.http.post(f"/v1/jobs/{job_id}/cancel")
    assert cancel.status_code == 200, cancel.text
    deadline = time.monotonic() + 180
    ended = ("CANCELLED", "FAILED", "PREEMPTED", "SUCCEEDED")
    while (attempt := api.job(job_id)["attempts"][-1])["status"] not in ended:
        assert time.monotonic() < deadline, f"attempt still {attempt['status']}:\n{stack.logs()}"
        time.sleep(0.5)
    return api.job(job_id)


def test_a_cancelled_run_saves_the_step_it_reached_before_it_stops(
    stack: Stack, api: Api, token: str
) -> None:
    stack.start_worker("w1")
    job = api.submit(long_run("graceful"))
    wait_for_steps(api, job["id"], 3, stack)

    cancelled = zeropilot(stack, token, "cancel", job["id"], "--checkpoint")
    done = api.job(job["id"])

    (attempt,) = done["attempts"]
    last_step = max(m["step"] for m in done["metrics"])
    (saved,) = done["checkpoints"]
    assert attempt["status"] == "CANCELLED"
    assert attempt["exit_code"] == 75  # zeropilot.runtime.STOPPED_EXIT_CODE, from both ranks
    assert saved["step"] >= last_step  # the step it reached, not an earlier interval
    assert saved["save_seconds"] is not None and saved["save_seconds"] >= 0
    assert Path(saved["path"]).name == f"global_step{saved['step']}"
    assert (Path(saved["path"]).parent / "latest").read_text() == f"global_step{saved['step']}"
    reason = [e["reason"] for e in done["events"] if e["subject"] == "attempt"][-1]
    assert f"stopped on request at step {saved['step']} after saving {saved['path']}" in reason
    assert "within its grace (30 s, the default (no save of this job measured yet))" in reason
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert "waiting for attempt 1 to save and stop (grace 30 s, the default" in cancelled.stderr
    assert f"attempt 1 saved step {saved['step']} before it stopped: {saved['path']}" in (
        cancelled.stdout
    )


def test_a_run_that_ignores_sigterm_is_killed_after_its_grace(
    stack: Stack, api: Api, token: str
) -> None:
    stack.start_worker("w1")
    spec = long_run("stubborn", "--ignore-sigterm", checkpoint={"grace_s": 3})
    job = api.submit(spec)
    wait_for_steps(api, job["id"], 2, stack)

    cancelled = zeropilot(stack, token, "cancel", job["id"], "--checkpoint")
    done = api.job(job["id"])

    (attempt,) = done["attempts"]
    assert attempt["status"] == "CANCELLED"
    assert attempt["exit_code"] == 137  # SIGKILL once the 3 s had passed
    assert done["checkpoints"] == []
    reason = [e["reason"] for e in done["events"] if e["subject"] == "attempt"][-1]
    assert reason == "job cancelled"
    assert attempt["stop_grace"] == "3 s, the spec's checkpoint.grace_s"
    assert cancelled.returncode == 1, cancelled.stdout + cancelled.stderr
    assert "attempt 1 stopped without saving" in cancelled.stdout
    assert "the last checkpoint is none" in cancelled.stdout


def test_a_stop_from_outside_saves_and_the_job_goes_on_from_that_step(
    stack: Stack, api: Api
) -> None:
    stack.start_worker("w1")
    job = api.submit(long_run("drained"))
    wait_for_steps(api, job["id"], 3, stack)
    first = api.job(job["id"])["attempts"][0]
    supervisor = stack.data_dir / "attempts" / first["backend_name"] / "supervisor.pid"

    os.kill(int(supervisor.read_text()), signal.SIGTERM)  # a drain, not zeropilot's own stop
    deadline = time.monotonic() + 240
    while len(attempts := api.job(job["id"])["attempts"]) < 2 or attempts[1]["status"] != "RUNNING":
        assert time.monotonic() < deadline, f"no second attempt running:\n{stack.logs()}"
        time.sleep(0.5)
    detail = api.job(job["id"])
    (saved,) = detail["checkpoints"]
    resumed = [m["step"] for m in detail["metrics"] if m["attempt_id"] == attempts[1]["id"]]
    cancel_and_wait(api, job["id"], stack)

    assert attempts[0]["status"] == "PREEMPTED"
    assert attempts[0]["failure_class"] == "PREEMPTED"
    assert attempts[1]["rung"].startswith("resume after a stop")
    assert attempts[1]["resumed_from"] == saved["path"]
    assert not resumed or min(resumed) == saved["step"] + 1  # on from the saved step
    assert detail["status"] == "RUNNING"
    queued = [e["reason"] for e in detail["events"] if e["to_status"] == "QUEUED"][-1]
    assert f"from the step-{saved['step']} checkpoint (not counted)" in queued
