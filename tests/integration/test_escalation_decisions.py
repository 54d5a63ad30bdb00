"""The reconcile's decisions after a GPU out-of-memory, on a real database, broker and backend.

The attempt's files are the local backend's own (``result.json``, ``node-0.log``) as a finished
run leaves them, with CUDA texts in the format of PyTorch's CUDACachingAllocator (no GPU here):
the reconcile reads them through the real backend, classifies, and decides.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from sqlmodel import Session

from service.core.advisor import advise
from service.core.attempt_kinds import AttemptKind
from service.core.clusters import BackendKind, ClusterProfile
from service.core.spec import JobSpec
from service.core.states import AttemptStatus, JobStatus
from service.db import jobs as job_store
from service.db.admission import admit_pending
from service.db.models import Attempt, Job
from service.db.session import get_engine
from service.db.transitions import move_attempt, move_job
from service.db.users import create_user, user_by_token
from service.settings import BrokerSettings, ClusterSettings, DatabaseSettings, Settings
from service.tasks import LAUNCH_ATTEMPT
from tests.integration.helpers import queued_tasks, tiny_spec
from workers.disruption import PREEMPTION_RUNG, RUNGS
from workers.reconcile import reconcile_attempt

GPU_BOX = ClusterProfile(
    name="gpu-box",
    kind=BackendKind.LOCAL,
    accelerator="nvidia-h100-80gb",
    gpu_memory_gib=80,
    gpus_per_node=2,
    cpu_memory_gib=512,
)


def cuda_oom(tried: str, free: str, others: str = "") -> str:
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried}. GPU 0 has a "
        f"total capacity of 79.19 GiB of which {free} is free. {others}Including non-PyTorch "
        "memory, this process has 37.40 GiB memory in use. Of the allocated memory 35.10 GiB is "
        "allocated by PyTorch, and 1.66 GiB is reserved by PyTorch but unallocated.\n"
    )


@pytest.fixture
def settings(tmp_path: Path, database_url: str, redis_url: str) -> Settings:
    profiles = tmp_path / "clusters.yaml"
    profiles.write_text(yaml.safe_dump({"clusters": [GPU_BOX.model_dump(mode="json")]}))
    return Settings(
        data_dir=tmp_path / "data",
        db=DatabaseSettings(url=database_url),
        broker=BrokerSettings(url=redis_url),
        clusters=ClusterSettings(profiles_file=profiles),
    )


def failed_run(
    settings: Settings,
    tmp_path: Path,
    log: str,
    max_attempts: int = 4,
    second: tuple[AttemptKind, str] | None = None,
) -> tuple[str, str]:
    """A job whose current attempt ran on gpu-box and ended with exit code 1 and this log;
    with ``second`` (kind, rung), attempt 1 failed before and attempt 2 (that one) is the one."""
    fields = tiny_spec(resources={"cluster": "gpu-box", "gpus_per_node": 2})
    spec = JobSpec.model_validate({**fields, "escalation": {"max_attempts": max_attempts}})
    plan = advise(spec, GPU_BOX).plan.model_dump(mode="json")
    attempt_dir = tmp_path / "attempt-1"
    attempt_dir.mkdir()
    (attempt_dir / "node-0.log").write_text("step 1 loss 4.2\n" + log)
    result = {"exit_codes": {"0": 1}, "first_failure": 0, "cancelled": False, "oom_kills": ""}
    (attempt_dir / "result.json").write_text(json.dumps(result))
    with Session(get_engine(settings.database_url)) as session:
        user = user_by_token(session, create_user(session, "alice", "vision"))
        assert user is not None
        job, _ = job_store.create_job(
            session, spec=spec, plan=plan, advice_reason="test", user=user,
            backend="local", idempotency_key=None,
        )  # fmt: skip
        admit_pending(session, settings.cluster_profiles())
        attempt = job_store.current_attempt(session, job)
        assert attempt is not None
        if second is not None:
            attempt = _second_attempt(session, job, attempt, *second)
        move_job(session, job, JobStatus.QUEUED, JobStatus.LAUNCHING, "launching",
                 current_attempt=attempt.number)  # fmt: skip
        move_attempt(session, attempt, AttemptStatus.QUEUED, AttemptStatus.LAUNCHING, "launching",
                     backend_ref=str(attempt_dir))  # fmt: skip
        move_job(session, job, JobStatus.LAUNCHING, JobStatus.RUNNING, "running")
        move_attempt(session, attempt, AttemptStatus.LAUNCHING, AttemptStatus.RUNNING, "running")
        session.commit()
        return job.id, attempt.id


def _second_attempt(
    session: Session, job: Job, first: Attempt, kind: AttemptKind, rung: str
) -> Attempt:
    for new in (AttemptStatus.LAUNCHING, AttemptStatus.RUNNING, AttemptStatus.FAILED):
        move_attempt(session, first, AttemptStatus(first.status), new, "failed")
    return job_store.add_attempt(
        session, job, kind=kind, number=2, plan=first.plan, rung=rung, backend="local"
    )


def test_an_oom_caused_by_other_processes_retries_the_same_plan(
    settings: Settings, tmp_path: Path, redis_url: str
) -> None:
    others = "Process 81231 has 40.25 GiB memory in use. "
    job_id, attempt_id = failed_run(settings, tmp_path, cuda_oom("4.00 GiB", "1.50 GiB", others))

    reconcile_attempt(settings, attempt_id)

    with Session(get_engine(settings.database_url)) as session:
        job = session.get(Job, job_id)
        first = session.get(Attempt, attempt_id)
        assert job is not None and first is not None
        second = job_store.current_attempt(session, job)
        assert (job.status, job.current_attempt) == (JobStatus.QUEUED, 2)
        assert second is not None and second.plan == first.plan
        assert second.rung == "retry: other processes held the GPU"
        assert first.failure_evidence["numbers"]["other_processes_bytes"] == int(40.25 * 1024**3)
        reasons = [e.reason for e in job_store.events_of(session, job_id)]
    escalating = next(r for r in reasons if r.startswith("OOM_GPU: tried 4.00 GiB"))
    assert "other processes held 40.25 GiB of the GPU's 79.19 GiB" in escalating
    assert (LAUNCH_ATTEMPT, [second.id]) in queued_tasks(redis_url)


def test_an_oom_no_plan_can_absorb_ends_the_job_with_the_numbers(
    settings: Settings, tmp_path: Path
) -> None:
    job_id, attempt_id = failed_run(settings, tmp_path, cuda_oom("75.00 GiB", "1.00 GiB"))

    reconcile_attempt(settings, attempt_id)

    with Session(get_engine(settings.database_url)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        assert (job.status, job.failure_class, job.current_attempt) == (
            JobStatus.FAILED, "OOM_GPU", 1,
        )  # fmt: skip
        reasons = [e.reason for e in job_store.events_of(session, job_id)]
    assert job.message.startswith("OOM_GPU (exit code 1): torch.OutOfMemoryError: CUDA out of")
    assert "not re-planned: no untried plan is predicted to fit" in job.message
    assert "to save the 74.00 GiB needed" in job.message
    note = next(r for r in reasons if r.startswith("not re-planned"))
    assert "tried 75.00 GiB, missing 74.00 GiB" in note


@pytest.mark.parametrize(
    ("second", "counted"),
    [
        ((AttemptKind.DISRUPTION, f"{RUNGS[AttemptKind.DISRUPTION]} (DisruptionTarget)"), False),
        ((AttemptKind.STOP, f"{RUNGS[AttemptKind.STOP]} (PREEMPTED)"), False),
        ((AttemptKind.PREEMPTION, f"{PREEMPTION_RUNG} (by job 0123456789abcdef)"), False),
        ((AttemptKind.REPLACEMENT, "re-placed on cpu-b after the launch on gpu-a failed"), False),
        ((AttemptKind.ESCALATION, "micro-batch 4 -> 2 (accumulation 1 -> 2)"), True),
        ((AttemptKind.OOM_RETRY, "retry: other processes held the GPU"), True),
    ],
)
def test_disruptions_stops_and_preemptions_use_none_of_the_users_attempts(
    settings: Settings, tmp_path: Path, second: tuple[AttemptKind, str], counted: bool
) -> None:
    log = cuda_oom("4.00 GiB", "1.50 GiB")
    job_id, attempt_id = failed_run(settings, tmp_path, log, 2, second)

    reconcile_attempt(settings, attempt_id)

    with Session(get_engine(settings.database_url)) as session:
        job = session.get(Job, job_id)
        assert job is not None and job.status == JobStatus.FAILED
    # After a disruption retry re-planning is still asked (here nothing saves 2.50 GiB); after
    # the user's own two attempts, max_attempts 2 ends it.
    assert ("not re-planned: 2 of at most 2 attempts used" in job.message) is counted
    assert ("no untried plan is predicted to fit" in job.message) is not counted
