"""After an out-of-memory failure: re-plan with the evidence, queue attempt N+1, or say why not."""

from __future__ import annotations

from sqlmodel import Session

from service.core.advisor import Candidate
from service.core.clusters import ClusterProfile
from service.core.escalation import Decision, evidence_from, replan
from service.core.failures import Diagnosis
from service.core.spec import JobSpec
from service.core.states import JobStatus
from service.db.jobs import add_attempt, attempts_of
from service.db.models import Attempt, Job, JobEvent
from service.db.transitions import move_job
from service.settings import Settings
from workers.disruption import counts_against_the_user
from workers.retention import resume_checkpoint


def escalate(
    session: Session,
    settings: Settings,
    job: Job,
    attempt: Attempt,
    spec: JobSpec,
    profile: ClusterProfile,
    diagnosis: Diagnosis,
) -> tuple[str | None, str]:
    """Queue the next attempt; return its id, or None and the reason (with numbers) why not."""
    failure = diagnosis.failure_class
    history = attempts_of(session, job.id)
    # Disruptions, stops, preemptions and re-placements have their own budgets or none.
    used = sum(1 for a in history if counts_against_the_user(a.rung))
    if used >= spec.escalation.max_attempts:
        limit = spec.escalation.max_attempts
        return None, f"not re-planned: {used} of at most {limit} attempts used"
    evidence = evidence_from(diagnosis.as_record(), attempt.runtime_evidence)
    current = Candidate.model_validate(attempt.plan)
    tried = [Candidate.model_validate(a.plan) for a in history]
    decision = replan(spec, profile, current, evidence, tried)
    if decision is None:
        return None, ""
    if decision.action == "stop" or decision.plan is None:
        reason = f"not re-planned: {decision.reason} ({evidence.describe()})"
        _note(session, attempt, reason)
        return None, reason
    moved = move_job(
        session,
        job,
        (JobStatus.LAUNCHING, JobStatus.RUNNING),
        JobStatus.ESCALATING,
        _escalation_reason(failure, diagnosis, evidence.describe(), current, decision),
    )
    if not moved:
        return None, ""
    return _queue(session, settings, job, attempt, spec, profile, current, decision), ""


def _escalation_reason(
    failure: str, diagnosis: Diagnosis, evidence: str, current: Candidate, decision: Decision
) -> str:
    assert decision.plan is not None
    plans = f"{current.label()} -> {decision.plan.label()}"
    if decision.action == "retry":
        return f"{failure}: {evidence}; {plans} kept: {decision.reason}"
    return f"{failure}: {evidence}; {plans} ({decision.change}): {decision.reason}"


def _note(session: Session, attempt: Attempt, reason: str) -> None:
    """An event on the attempt: why the job ends here, with the numbers."""
    session.add(
        JobEvent(
            job_id=attempt.job_id,
            subject="attempt",
            attempt_number=attempt.number,
            from_status=attempt.status,
            to_status=attempt.status,
            reason=reason[:2000],
        )
    )


def _queue(
    session: Session,
    settings: Settings,
    job: Job,
    attempt: Attempt,
    spec: JobSpec,
    profile: ClusterProfile,
    current: Candidate,
    decision: Decision,
) -> str:
    assert decision.plan is not None
    checkpoint = resume_checkpoint(session, settings, job) if spec.checkpoint.resume else None
    method = resume_method(current, decision.plan) if checkpoint else None
    plan = decision.plan.model_dump(mode="json")
    if method == "universal":  # the engine must be built to load one
        plan["ds_config"]["checkpoint"] = {"load_universal": True}
    rung = "retry: other processes held the GPU" if decision.action == "retry" else decision.change
    number = attempt.number + 1
    new = add_attempt(
        session,
        job,
        number=number,
        plan=plan,
        rung=rung,
        backend=profile.kind,
        resumed_from=checkpoint.path if checkpoint else None,
        resume_method=method,
    )
    move_job(
        session,
        job,
        JobStatus.ESCALATING,
        JobStatus.QUEUED,
        f"attempt {number} queued: {rung}",
        current_attempt=number,
        plan=plan,
        advice_reason=f"Re-planned after attempt {attempt.number}: {decision.reason}.",
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
