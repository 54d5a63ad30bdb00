"""The whole journey through real processes: HTTP -> Celery worker -> local backend -> DeepSpeed.

Each test trains the tiny GPT with two CPU ranks (gloo) under a real ZeRO stage.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.stack import Api, Stack
from tests.integration.helpers import tiny_spec

pytestmark = pytest.mark.slow


def job_statuses(job: dict) -> list[str]:  # type: ignore[type-arg]
    return [e["to_status"] for e in job["events"] if e["subject"] == "job"]


def test_submitted_job_trains_to_success_with_metrics_and_checkpoint(
    stack: Stack, api: Api
) -> None:
    stack.start_worker("w1")
    job = api.submit(tiny_spec(steps=20, zero={"stage": 2}))
    assert job["plan"]["zero_stage"] == 2
    done = api.wait_for(job["id"], {"SUCCEEDED", "FAILED"}, stack)
    assert done["status"] == "SUCCEEDED", done["message"]
    assert job_statuses(done) == ["PENDING", "QUEUED", "LAUNCHING", "RUNNING", "SUCCEEDED"]
    attempt = done["attempts"][0]
    assert (attempt["status"], attempt["exit_code"]) == ("SUCCEEDED", 0)

    losses = [m["loss"] for m in done["metrics"]]
    assert [m["step"] for m in done["metrics"]] == list(range(1, 21))
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5  # it learned

    checkpoint = Path(done["checkpoints"][-1]["path"])
    assert checkpoint.name == "global_step20" and checkpoint.is_dir()
    assert any(checkpoint.glob("*optim_states.pt"))  # ZeRO-partitioned optimizer shards
    assert (checkpoint.parent / "latest").read_text().strip() == "global_step20"

    logs = api.http.get(f"/v1/jobs/{job['id']}/logs", params={"tail": 50}).json()["text"]
    assert "step 20 loss" in logs


@pytest.mark.parametrize("crash_point", ["before_submit", "after_submit"])
def test_worker_killed_mid_launch_neither_loses_nor_doubles_the_job(
    stack: Stack, api: Api, crash_point: str
) -> None:
    doomed = stack.start_worker("doomed", **{f"fault_pause_{crash_point}_s": "60"})
    job = api.submit(tiny_spec(steps=10, zero={"stage": 1}))
    attempt_dir = stack.data_dir / "attempts" / job["attempts"][0]["backend_name"]
    api.wait_for(job["id"], {"LAUNCHING"}, stack, timeout_s=60)
    if crash_point == "after_submit":  # killed after the processes started, before recording it
        _wait_for_file(attempt_dir / "started", stack)
    stack.kill(doomed)

    stack.start_worker("rescuer")
    done = api.wait_for(job["id"], {"SUCCEEDED", "FAILED"}, stack)
    assert done["status"] == "SUCCEEDED", done["message"]
    assert len(done["attempts"]) == 1
    node_log = (attempt_dir / "node-0.log").read_text()
    assert node_log.count("dist_world_size=2") == 1  # the launcher ran exactly once
    assert job_statuses(done).count("LAUNCHING") == 1


def _wait_for_file(path: Path, stack: Stack, timeout_s: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared:\n{stack.logs()}"
        time.sleep(0.2)
