"""After an out-of-memory failure: re-plan with the evidence, queue attempt N+1, or say why not."""

from __future__ import annotations

from sqlmodel import Session

from service.core.advisor import Candidate
from service.core.attempt_kinds import AttemptKind, max_attempts_used
from service.core.clusters import ClusterProfile
from service.core.escalation import Decision, evidence_from, replan
from service.core.failures import Diagnosis
from service.core.spec import JobSpec
from service.core.states import JobStatus
from service.db.attempts import next_attempt
from service.db.jobs import attempts_of
from service.db.models import Attempt, Job, JobEvent
from service.db.transitions import move_job
from service.settings import Settings

OOM_RETRY_RUNG = "retry: other processes held the GPU"


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
    used = max_attempts_used(a.kind for a in history)
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
    return _queue(session, settings, job, attempt, profile, decision), ""


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
    profile: ClusterProfile,
    decision: Decision,
) -> str:
    assert decision.plan is not None
    retry = decision.action == "retry"
    kind = AttemptKind.OOM_RETRY if retry else AttemptKind.ESCALATION
    rung = OOM_RETRY_RUNG if retry else decision.change
    new = next_attempt(
        session, settings.data_dir, job, attempt, kind,
        rung=rung, backend=profile.kind, plan=decision.plan,
    ).attempt  # fmt: skip
    move_job(
        session,
        job,
        JobStatus.ESCALATING,
        JobStatus.QUEUED,
        f"attempt {new.number} queued: {rung}",
        current_attempt=new.number,
        plan=new.plan,
        advice_reason=f"Re-planned after attempt {attempt.number}: {decision.reason}.",
    )
    return new.id
