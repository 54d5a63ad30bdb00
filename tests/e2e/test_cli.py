"""The CLI a user types, against the running stack: submit --wait, failures, bad input, cancel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest
import yaml

from tests.e2e.faults import AnswerDroppingProxy, database_refusing
from tests.e2e.stack import Api, Stack
from tests.integration.helpers import tiny_spec

pytestmark = pytest.mark.slow


def zeropilot(
    stack: Stack, token: str, *argv: str, url: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ZEROPILOT_URL": url or stack.url, "ZEROPILOT_TOKEN": token}
    return subprocess.run(
        [sys.executable, "-m", "zeropilot.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def spec_file(tmp_path: Path, **changes: Any) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(tiny_spec(**changes)))
    return path


def test_submit_wait_prints_the_journey_and_exits_zero(
    stack: Stack, token: str, tmp_path: Path
) -> None:
    stack.start_worker("w1")
    result = zeropilot(stack, token, "submit", str(spec_file(tmp_path, steps=12)), "--wait")
    assert result.returncode == 0, result.stdout + result.stderr + stack.logs()
    out = result.stdout
    for status in ("QUEUED", "LAUNCHING", "RUNNING", "SUCCEEDED"):
        assert status in out
    assert out.index("RUNNING") < out.index("step    12") < out.index("SUCCEEDED")
    assert "plan: ZeRO-" in out

    listing = json.loads(zeropilot(stack, token, "list", "--json").stdout)
    job_id = listing["data"][0]["id"]
    status = zeropilot(stack, token, "status", job_id)
    assert "SUCCEEDED" in status.stdout and "checkpoints:" in status.stdout
    assert "global_step12" in status.stdout
    metrics = json.loads(zeropilot(stack, token, "metrics", job_id, "--json").stdout)
    assert [m["step"] for m in metrics] == list(range(1, 13))
    logs = zeropilot(stack, token, "logs", job_id, "--tail", "20")
    assert "step 12 loss" in logs.stdout


def test_failed_training_exits_one_with_its_failure_class(
    stack: Stack, token: str, tmp_path: Path
) -> None:
    stack.start_worker("w1")
    path = spec_file(tmp_path, steps=5, args=["--steps", "5", "--fail-at-step", "2"])
    result = zeropilot(stack, token, "submit", str(path), "--wait", "--json")
    assert result.returncode == 1, result.stderr + stack.logs()
    job = json.loads(result.stdout)
    assert (job["status"], job["failure_class"]) == ("FAILED", "USER_ERROR")
    assert job["attempts"][0]["exit_code"] == 3


def test_bad_spec_exits_two_naming_the_field(stack: Stack, token: str, tmp_path: Path) -> None:
    path = spec_file(tmp_path, training={"sequence_length": 0, "global_batch_size": 8})
    result = zeropilot(stack, token, "submit", str(path))
    assert result.returncode == 2
    assert "training.sequence_length" in result.stderr
    assert "greater than 0" in result.stderr
    missing = zeropilot(stack, token, "submit", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_cancel_stops_a_running_job(stack: Stack, api: Api, token: str) -> None:
    stack.start_worker("w1")
    job = api.submit(tiny_spec(steps=100000))
    api.wait_for(job["id"], {"RUNNING"}, stack)
    result = zeropilot(stack, token, "cancel", job["id"])
    assert result.returncode == 0 and "CANCELLED" in result.stdout
    deadline_job = api.wait_for(job["id"], {"CANCELLED"}, stack)
    attempt_dir = stack.data_dir / "attempts" / deadline_job["attempts"][0]["backend_name"]
    import time

    deadline = time.monotonic() + 60
    while api.job(job["id"])["attempts"][0]["status"] != "CANCELLED":
        assert time.monotonic() < deadline, stack.logs()
        time.sleep(1)
    result_file = json.loads((attempt_dir / "result.json").read_text())
    assert result_file["cancelled"] is True


def test_submit_whose_answer_was_lost_stores_one_job(
    stack: Stack, api: Api, token: str, tmp_path: Path
) -> None:
    proxy = AnswerDroppingProxy(stack.port, drop=1)  # the server stores the job, the answer is lost
    result = zeropilot(stack, token, "submit", str(spec_file(tmp_path)), "--json", url=proxy.url)
    proxy.close()
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"connection to {proxy.url} lost before the answer, retrying in 1 s (2/5)"
    ]
    listing = api.http.get("/v1/jobs").json()
    assert [job["id"] for job in listing["data"]] == [json.loads(result.stdout)["id"]]


def test_submit_waits_out_a_database_outage(
    stack: Stack, api: Api, token: str, tmp_path: Path, postgres_url: str
) -> None:
    env = {**os.environ, "ZEROPILOT_URL": stack.url, "ZEROPILOT_TOKEN": token}
    argv = [sys.executable, "-m", "zeropilot.cli", "submit", str(spec_file(tmp_path)), "--json"]
    with database_refusing(postgres_url):
        cli = subprocess.Popen(argv, env=env, stdout=PIPE, stderr=PIPE, text=True)
        assert cli.stderr is not None
        first_retry = cli.stderr.readline()  # the outage lasts until the CLI has met it
    out, rest = cli.communicate(timeout=120)
    assert first_retry == "database unavailable, retrying in 5 s (2/5)\n", first_retry + rest
    assert cli.returncode == 0, rest
    listing = api.http.get("/v1/jobs").json()
    assert [job["id"] for job in listing["data"]] == [json.loads(out)["id"]]


def test_a_resubmit_with_the_same_key_returns_the_job_and_another_spec_is_refused(
    stack: Stack, api: Api, token: str, tmp_path: Path
) -> None:
    path = spec_file(tmp_path)
    first, again = (
        zeropilot(stack, token, "submit", str(path), "--idempotency-key", "k1", "--json")
        for _ in range(2)
    )
    assert first.returncode == again.returncode == 0, first.stderr + again.stderr
    assert json.loads(first.stdout)["id"] == json.loads(again.stdout)["id"]
    changed = zeropilot(
        stack, token, "submit", str(spec_file(tmp_path, steps=7)), "--idempotency-key", "k1"
    )
    assert changed.returncode == 1
    assert "409: Idempotency-Key was already used for job" in changed.stderr
    assert api.http.get("/v1/jobs").json()["count"] == 1
