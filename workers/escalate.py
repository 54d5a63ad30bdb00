"""After an out-of-memory failure that ``service.core.outcomes`` answers with a re-plan: the
job's move to ESCALATING with the evidence and both plans, and attempt N+1 with the new plan (or
the same, when other processes crowded the GPU) queued."""

from __future__ import annotations

from sqlmodel import Session

from service.core.advisor import Candidate
from service.core.attempt_kinds import AttemptKind
from service.core.escalation import Decision
from service.core.outcomes import Ending, Escalate
from service.core.states import JobStatus
from service.db.attempts import next_attempt
from service.db.models import Attempt, Job
from service.db.transitions import move_job
from service.settings import Settings

OOM_RETRY_RUNG = "retry: other processes held the GPU"


def escalate(
    session: Session,
    settings: Settings,
    job: Job,
    attempt: Attempt,
    outcome: Escalate,
    ending: Ending,
    evidence: str,
) -> str | None:
    """Queue the re-planned attempt; its id, or None when the job moved on meanwhile."""
    decision = outcome.replan
    current = Candidate.model_validate(attempt.plan)
    reason = _escalation_reason(str(ending.failure), evidence, current, decision)
    if not move_job(
        session, job, (JobStatus.LAUNCHING, JobStatus.RUNNING), JobStatus.ESCALATING, reason
    ):
        return None
    assert decision.plan is not None
    rung = OOM_RETRY_RUNG if outcome.kind == AttemptKind.OOM_RETRY else decision.change
    backend = settings.cluster_profiles()[job.cluster].kind
    new = next_attempt(
        session, settings.data_dir, job, attempt, outcome.kind,
        rung=rung, backend=backend, plan=decision.plan,
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


def _escalation_reason(failure: str, evidence: str, current: Candidate, decision: Decision) -> str:
    assert decision.plan is not None
    plans = f"{current.label()} -> {decision.plan.label()}"
    if decision.action == "retry":
        return f"{failure}: {evidence}; {plans} kept: {decision.reason}"
    return f"{failure}: {evidence}; {plans} ({decision.change}): {decision.reason}"
