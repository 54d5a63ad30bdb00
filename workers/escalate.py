"""Climbing the memory ladder after an out-of-memory failure: plan attempt N+1 and queue it."""

from __future__ import annotations

from sqlmodel import Session

from service.core.advisor import Candidate
from service.core.clusters import ClusterProfile
from service.core.escalation import next_rung
from service.core.failures import FailureClass
from service.core.spec import JobSpec
from service.core.states import JobStatus
from service.db.jobs import add_attempt, attempts_of, latest_checkpoint
from service.db.models import Attempt, Job
from service.db.transitions import move_job


def escalate(
    session: Session,
    job: Job,
    attempt: Attempt,
    spec: JobSpec,
    profile: ClusterProfile,
    failure: FailureClass,
) -> str | None:
    """Plan the next rung and queue it; return the new attempt's id, or None when none is left."""
    if attempt.number >= spec.escalation.max_attempts:
        return None
    current = Candidate.model_validate(attempt.plan)
    tried = [Candidate.model_validate(a.plan) for a in attempts_of(session, job.id)]
    step = next_rung(spec, profile, current, failure, tried)
    if step is None:
        return None
    candidate, description = step
    active = (JobStatus.LAUNCHING, JobStatus.RUNNING)
    if not move_job(session, job, active, JobStatus.ESCALATING, f"{failure}: {description}"):
        return None
    checkpoint = latest_checkpoint(session, job.id) if spec.checkpoint.resume else None
    method = resume_method(current, candidate) if checkpoint else None
    plan = candidate.model_dump(mode="json")
    if method == "universal":  # the engine must be built to load one
        plan["ds_config"]["checkpoint"] = {"load_universal": True}
    number = attempt.number + 1
    new = add_attempt(
        session,
        job,
        number=number,
        plan=plan,
        rung=description,
        backend=profile.kind,
        resumed_from=checkpoint.path if checkpoint else None,
        resume_method=method,
    )
    move_job(
        session,
        job,
        JobStatus.ESCALATING,
        JobStatus.QUEUED,
        f"attempt {number} queued: {description}",
        current_attempt=number,
        plan=plan,
    )
    return new.id


def resume_method(previous: Candidate, following: Candidate) -> str:
    """How the next attempt loads the last checkpoint (see zeropilot.runtime.ResumePoint).

    Native when the ZeRO partitioning is unchanged. Between ZeRO-1 and 2, DeepSpeed's universal
    checkpoint re-partitions the fp32 weights and optimizer states. DeepSpeed 0.19.8 cannot load
    a universal checkpoint of a ZeRO-1/2 run into ZeRO-3 (its stage-3 loader wants its own
    optimizer file) and keeps no optimizer partitions at ZeRO-0 to convert (both measured), so
    those resume from the consolidated weights with a fresh optimizer.
    """
    before, after = previous.zero_stage, following.zero_stage
    if before == after:
        return "native"
    if {before, after} <= {1, 2}:
        return "universal"
    return "weights"
