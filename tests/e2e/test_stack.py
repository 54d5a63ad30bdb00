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
