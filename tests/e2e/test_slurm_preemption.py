"""Preemption on the real Slurm of the tests, through the whole service: the borrower's ranks
get SIGTERM from ``scancel --signal=TERM``, save the step they reached, exit 75; the job waits,
then resumes from that checkpoint on Slurm and succeeds, with no escalation attempt used.

The API (on the bridge the Slurm nodes reach), a Celery worker with beat, the two-node Slurm
cluster of deploy/slurm and DeepSpeed ranks on gloo are real; each rank counts as one GPU.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.db.migrate import upgrade
from tests.e2e.stack import Api, Stack
from tests.e2e.test_preemption import wait_until
from tests.e2e.test_slurm_stack import BRIDGE_ADDRESS
from tests.integration.helpers import three_users, tiny_spec
from tests.integration.slurm_fixtures import LocalSlurm, slurm_profile
from workers.backends import slurm

pytestmark = pytest.mark.slow
GRACE_S = 20  # the spec's checkpoint.grace_s: far more than a save of the tiny model takes


@pytest.fixture
def sharing_slurm(
    tmp_path: Path, postgres_url: str, redis_url: str, slurm_cluster: LocalSlurm
) -> Iterator[Stack]:
    profiles = tmp_path / "clusters.yaml"
    profile = slurm_profile(slurm_cluster).model_dump(mode="json")
    profiles.write_text(yaml.safe_dump({"clusters": [profile]}))
    upgrade(postgres_url)
    stack = Stack(
        tmp_path / "data", postgres_url, redis_url,
        host="0.0.0.0",  # the ranks report from the nodes' network namespaces
        clusters__profiles_file=str(profiles),
        scheduling__borrowing="true", scheduling__preemption="true",
        scheduling__min_runtime_s="0",  # the test's jobs are seconds long
    )  # fmt: skip
    stack.env["ZEROPILOT_API__PUBLIC_URL"] = f"http://{BRIDGE_ADDRESS}:{stack.port}"
    stack.start_api()
    yield stack
    stack.stop()
    for recorded in (stack.data_dir / "attempts").glob(f"*/{slurm.JOB_ID_FILE}"):
        slurm_cluster.command("scancel", recorded.read_text().strip())  # none left running


def slurm_job(name: str, steps: int, gpus: int, priority: int) -> dict[str, Any]:
    resources = {"cluster": "slurm-local", "nodes": 1, "gpus_per_node": gpus}
    spec = tiny_spec(
        name, steps=steps, resources=resources, checkpoint={"grace_s": GRACE_S}, priority=priority
    )
    return {**spec, "args": ["--steps", str(steps), "--checkpoint-interval", "100000"]}


def test_a_preempted_slurm_job_saves_where_it_was_and_resumes_from_there(
    sharing_slurm: Stack, postgres_url: str
) -> None:
    tokens = three_users(postgres_url)
    apis = {name: Api(sharing_slurm.url, token) for name, token in tokens.items()}
    for team in ("vision", "speech"):  # a pool of 2 GPUs: each team's quota is 1
        answer = apis["root"].http.patch(f"/v1/teams/{team}", json={"gpu_quota": 1})
        assert answer.status_code == 200, answer.text
    sharing_slurm.start_worker("w1")
    bob, alice = apis["bob"], apis["alice"]
    # Low priority, so that once stopped it waits behind the job it stopped for: with equal
    # priorities admission takes the older, requeued job first and it is preempted again.
    borrower = bob.submit(slurm_job("speech-borrow", steps=300, gpus=2, priority=10))
    wait_until(lambda: len(bob.http.get(f"/v1/jobs/{borrower['id']}/metrics").json()) >= 3,
               "steps of the borrower", sharing_slurm)  # fmt: skip
    assert bob.job(borrower["id"])["borrowing"] is True

    reclaim = alice.submit(slurm_job("vision-own", steps=5, gpus=1, priority=50))
    stopped_at = time.monotonic()
    done = alice.wait_for(reclaim["id"], {"SUCCEEDED", "FAILED"}, sharing_slurm, timeout_s=600)
    preempted_within = time.monotonic() - stopped_at
    resumed = bob.wait_for(borrower["id"], {"SUCCEEDED", "FAILED"}, sharing_slurm, timeout_s=600)

    assert done["status"] == "SUCCEEDED", done["message"]
    assert resumed["status"] == "SUCCEEDED", (resumed["message"], sharing_slurm.logs())
    first, second = resumed["attempts"]
    assert (first["status"], first["failure_class"]) == ("PREEMPTED", "PREEMPTED")
    assert first["exit_code"] == 75  # zeropilot.runtime.STOPPED_EXIT_CODE, through srun and sbatch
    assert f"preempted by job {reclaim['id']}: stopped after saving" in first["failure_message"]
    assert first["stop_grace"] == f"{GRACE_S} s, the spec's checkpoint.grace_s"
    saved = next(c for c in resumed["checkpoints"] if c["attempt_id"] == first["id"])
    first_steps = [m["step"] for m in resumed["metrics"] if m["attempt_id"] == first["id"]]
    assert saved["step"] >= max(first_steps)  # the step it reached, not an interval checkpoint
    assert Path(saved["path"]).name == f"global_step{saved['step']}"
    assert second["rung"] == f"resume after preemption (by job {reclaim['id']})"
    assert second["resumed_from"] == saved["path"]
    steps = [m["step"] for m in resumed["metrics"] if m["attempt_id"] == second["id"]]
    assert min(steps) == saved["step"] + 1 and max(steps) == 300  # on from the saved step
    assert resumed["preempted_by"] == [reclaim["id"]]
    assert [a["status"] for a in done["attempts"]] == ["SUCCEEDED"]
    queued = [e["reason"] for e in resumed["events"] if e["subject"] == "job"]
    assert any("(not counted)" in reason for reason in queued)
    print(f"reclaiming job done {preempted_within:.1f} s after its submit; saved step"
          f" {saved['step']}, resumed at {min(steps)}")  # fmt: skip


def test_a_preempted_slurm_job_that_ignores_sigterm_is_killed_after_its_grace(
    sharing_slurm: Stack, postgres_url: str
) -> None:
    tokens = three_users(postgres_url)
    apis = {name: Api(sharing_slurm.url, token) for name, token in tokens.items()}
    for team in ("vision", "speech"):
        answer = apis["root"].http.patch(f"/v1/teams/{team}", json={"gpu_quota": 1})
        assert answer.status_code == 200, answer.text
    sharing_slurm.start_worker("w1")
    bob, alice = apis["bob"], apis["alice"]
    spec = slurm_job("speech-stubborn", steps=300, gpus=2, priority=10)
    args = ["--steps", "300", "--checkpoint-interval", "5", "--ignore-sigterm"]
    spec = {**spec, "checkpoint": {"grace_s": 3}, "args": args}
    borrower = bob.submit(spec)
    wait_until(lambda: len(bob.http.get(f"/v1/jobs/{borrower['id']}/checkpoints").json()) >= 1,
               "an interval checkpoint of the borrower", sharing_slurm)  # fmt: skip

    reclaim = alice.submit(slurm_job("vision-own", steps=5, gpus=1, priority=50))
    done = alice.wait_for(reclaim["id"], {"SUCCEEDED", "FAILED"}, sharing_slurm, timeout_s=600)
    resumed = bob.wait_for(borrower["id"], {"SUCCEEDED", "FAILED"}, sharing_slurm, timeout_s=600)

    assert done["status"] == "SUCCEEDED", done["message"]
    assert resumed["status"] == "SUCCEEDED", (resumed["message"], sharing_slurm.logs())
    first, second = resumed["attempts"]
    assert first["status"] == "PREEMPTED"
    assert first["failure_message"].startswith(f"preempted by job {reclaim['id']}: stopped (")
    assert "after saving" not in first["failure_message"]  # killed: it saved nothing at the stop
    assert first["native_state"] == "CANCELLED"  # scancel, once the grace had passed
    _, folder = slurm.decode_ref(first["backend_ref"])
    term_at, killed_at = slurm.term_sent_at(folder), (folder / slurm.KILL_MARKER).read_text()
    assert term_at is not None
    waited = float(killed_at) - term_at
    assert 3 <= waited < 3 + 5  # the grace, then the next reconcile pass (1 s apart here)
    interval = [c for c in resumed["checkpoints"] if c["attempt_id"] == first["id"]]
    latest = max(interval, key=lambda c: c["step"])
    assert latest["step"] % 5 == 0  # an interval checkpoint, the last complete one
    assert second["resumed_from"] == latest["path"]
    steps = [m["step"] for m in resumed["metrics"] if m["attempt_id"] == second["id"]]
    assert min(steps) == latest["step"] + 1 and max(steps) == 300
    print(f"scancel {waited:.1f} s after the SIGTERM (grace 3 s); resumed at {min(steps)}")
