"""A rank that stops making progress is found hung, its peers' stacks are logged, and the job
resumes from its last checkpoint: a real fault (SIGSTOP to one of two gloo ranks mid-run), real
processes throughout (the API, a Celery worker, the local supervisor, DeepSpeed's launcher and
``examples/train_tiny.py``), followed over HTTP.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests.e2e.stack import Api, Stack
from tests.e2e.test_graceful_stop import wait_for_steps
from tests.integration.helpers import tiny_spec

pytestmark = pytest.mark.slow
FLOOR_S = 5  # the job's hang floor: its steps take ~0.1 s, so 10 x a step is below it


def rank_pid(attempt_id: str, rank: int) -> int:
    """The process of one training rank of the attempt, found by its environment."""
    wanted = {f"ZEROPILOT_ATTEMPT_ID={attempt_id}".encode(), f"RANK={rank}".encode()}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = set(Path(entry.path, "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if wanted <= environ:
            return int(entry.name)
    raise AssertionError(f"no rank {rank} of attempt {attempt_id} runs")


def test_a_rank_stopped_mid_run_is_found_hung_and_the_job_resumes_from_its_checkpoint(
    stack: Stack, api: Api
) -> None:
    stack.start_worker("w1", health_interval_s="1")
    spec = tiny_spec("hang", steps=60)
    spec["args"] = ["--steps", "60", "--checkpoint-interval", "5"]
    spec["health"] = {"hang_floor_s": FLOOR_S, "hang_factor": 10, "first_step_s": 600}
    job = api.submit(spec)
    wait_for_steps(api, job["id"], 12, stack)
    first = api.job(job["id"])["attempts"][0]
    os.kill(rank_pid(first["id"], 1), signal.SIGSTOP)  # it holds its peer in the next collective

    done = api.wait_for(job["id"], {"SUCCEEDED", "FAILED"}, stack, timeout_s=300)

    assert done["status"] == "SUCCEEDED", (done["message"], stack.logs())
    hung, resumed = done["attempts"]
    assert hung["failure_class"] == "HANG"
    waited = re.search(r"no step for (\d+) s after step (\d+)", hung["failure_message"])
    assert waited is not None, hung["failure_message"]
    # found within the floor plus the watch's interval and a pass or two (1 s each), with room
    # for a loaded machine; never before the floor
    assert FLOOR_S <= int(waited[1]) <= FLOOR_S + 20
    assert (resumed["kind"], resumed["resumed_from"] is not None) == ("fault_retry", True)
    assert resumed["rung"].startswith("retry after a fault (")
    assert max(m["step"] for m in done["metrics"]) == 60
    reasons = [e["reason"] for e in done["events"]]
    assert any(r.startswith("hung: no step for") and "for their stacks" in r for r in reasons)
    assert "(not counted)" in next(r for r in reasons if r.startswith("attempt 2 queued"))
    # rank 0, blocked in the collective its stopped peer never joined, printed its stacks; a
    # user reads them as `zeropilot logs <job> --attempt 1` does
    logs = api.http.get(f"/v1/jobs/{job['id']}/logs", params={"attempt": 1, "tail": 2000})
    text = logs.json()["text"]
    assert "most recent call first" in text, text[-3000:]
    assert "train_tiny.py" in text.split("most recent call first", 1)[1]
    print("attempt 1:", hung["failure_message"])  # for docs/faults.md
    print("attempt 2:", resumed["rung"], "from", resumed["resumed_from"])
