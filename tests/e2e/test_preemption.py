"""Borrowing and preemption through real processes: a team runs on another's idle GPUs, the
owner reclaims them, the borrower saves the step it reached, waits, and goes on from there.

The API (uvicorn), a Celery worker with beat, the local backend and DeepSpeed ranks on gloo are
real; each tiny job's two ranks count as its 2 GPUs (the local profile's accounting).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.db.migrate import upgrade
from tests.e2e.stack import Api, Stack
from tests.e2e.test_cli import zeropilot
from tests.integration.helpers import three_users, tiny_spec
from tests.integration.test_resume import SAME_LOSS_RTOL

pytestmark = pytest.mark.slow


@pytest.fixture
def sharing(tmp_path: Path, postgres_url: str, redis_url: str) -> Iterator[Stack]:
    upgrade(postgres_url)
    running = Stack(
        tmp_path / "data", postgres_url, redis_url,
        scheduling__borrowing="true", scheduling__preemption="true",
        scheduling__min_runtime_s="0",  # the tests' jobs are seconds long
    )  # fmt: skip
    running.start_api()
    yield running
    running.stop()


def job_of(steps: int, name: str) -> dict[str, Any]:
    spec = tiny_spec(name, steps=steps)
    return {**spec, "args": ["--steps", str(steps), "--checkpoint-interval", "100000"]}


def wait_until(check: Any, what: str, stack: Stack, timeout_s: float = 420) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, f"no {what}:\n{stack.logs()}"
        time.sleep(0.5)
    return found


def test_the_owner_reclaims_lent_gpus_and_the_borrower_resumes_where_it_stopped(
    sharing: Stack, postgres_url: str
) -> None:
    tokens = three_users(postgres_url)
    apis = {name: Api(sharing.url, token) for name, token in tokens.items()}
    for team in ("vision", "speech"):
        answer = apis["root"].http.patch(f"/v1/teams/{team}", json={"gpu_quota": 2})
        assert answer.status_code == 200, answer.text
    sharing.start_worker("w1")
    bob = apis["bob"]
    owned = bob.submit(job_of(60, "speech-own"))  # within speech's quota of 2
    borrower = bob.submit(job_of(60, "speech-borrow"))  # vision's 2 idle GPUs
    wait_until(lambda: len(bob.http.get(f"/v1/jobs/{borrower['id']}/metrics").json()) >= 2,
               "steps of the borrower", sharing)  # fmt: skip
    assert bob.job(borrower["id"])["borrowing"] is True

    reclaim = apis["alice"].submit(job_of(10, "vision-own"))
    done = apis["alice"].wait_for(reclaim["id"], {"SUCCEEDED", "FAILED"}, sharing)
    resumed = bob.wait_for(borrower["id"], {"SUCCEEDED", "FAILED"}, sharing)
    bob.wait_for(owned["id"], {"SUCCEEDED", "FAILED"}, sharing)

    assert done["status"] == "SUCCEEDED", done["message"]
    assert resumed["status"] == "SUCCEEDED", resumed["message"]
    first, second = resumed["attempts"]
    assert first["status"] == "PREEMPTED"
    assert f"preempted by job {reclaim['id']}: stopped after saving" in first["failure_message"]
    assert second["rung"] == f"resume after preemption (by job {reclaim['id']})"
    saved = next(c for c in resumed["checkpoints"] if c["attempt_id"] == first["id"])
    assert second["resumed_from"] == saved["path"]
    steps = [m["step"] for m in resumed["metrics"] if m["attempt_id"] == second["id"]]
    assert min(steps) == saved["step"] + 1 and max(steps) == 60  # on from the saved step
    # The same spec run without a stop: the resumed losses go on as if none had happened
    unstopped = {m["step"]: m["loss"] for m in bob.job(owned["id"])["metrics"]}
    for point in (m for m in resumed["metrics"] if m["attempt_id"] == second["id"]):
        assert point["loss"] == pytest.approx(unstopped[point["step"]], rel=SAME_LOSS_RTOL)
    reasons = [e["reason"] for e in resumed["events"]]
    assert any(
        r.startswith(f"preempted by job {reclaim['id']} (priority 50, team vision): team vision"
                     " reclaims GPUs of its quota that team speech borrows") for r in reasons
    )  # fmt: skip
    assert resumed["preempted_by"] == [reclaim["id"]]
    waited = [e["reason"] for e in done["events"]]
    assert f"stopping job {borrower['id']} to free its GPUs for this one" in waited
    assert bob.job(owned["id"])["attempts"][0]["status"] == "SUCCEEDED"  # never a victim
    shown = zeropilot(sharing, tokens["bob"], "status", borrower["id"])
    assert f"sharing: preempted 1x (by job {reclaim['id']})" in shown.stdout, shown.stderr
    assert "attempt 1: PREEMPTED" in shown.stdout
    listing = json.loads(zeropilot(sharing, tokens["bob"], "list", "--json").stdout)["data"]
    assert {j["id"]: j["preempted_by"] for j in listing}[borrower["id"]] == [reclaim["id"]]
    assert "1x" in zeropilot(sharing, tokens["bob"], "list").stdout  # the PREEMPTED column
    console_rows = bob.http.get("/console/api/jobs").json()["data"]
    assert {r["id"]: r["preemptions"] for r in console_rows}[borrower["id"]] == 1
    scraped = sharing_metrics(sharing)
    assert 'zeropilot_attempts_preempted_total{cluster="local"} 1.0' in scraped


def sharing_metrics(stack: Stack) -> str:
    """What a scraper reads from the API's /metrics (no token)."""
    return httpx.get(f"{stack.url}/metrics", timeout=30).text
