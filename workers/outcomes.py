"""Carrying out what follows an attempt's end: gather the facts, ``decide``, apply.

The reconcile pass calls ``run_ended`` when a cluster says an attempt's processes ended; the
launch task calls ``launch_failed`` when a launch failed for good. Both gather what
``service.core.outcomes.decide`` reads, record how the attempt ended, and carry the outcome out
through the status writer: the job's move, and attempt N+1 from
``service.db.attempts.next_attempt`` where one follows. No rule of what follows lives here
(docs/lifecycle.md is the table).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from sqlmodel import Session

from service.core.advisor import Candidate
from service.core.attempt_kinds import AttemptKind
from service.core.escalation import Decision as Replan
from service.core.escalation import evidence_from, replan
from service.core.failures import Diagnosis, FailureClass, diagnose_failure
from service.core.outcomes import (
    Cancel,
    Ending,
    Escalate,
    Facts,
    Fail,
    FinishedBeforeCancel,
    Outcome,
    Phase,
    Replace,
    Requeue,
    Retry,
    Succeed,
    decide,
)
from service.core.spec import JobSpec
from service.core.states import AttemptStatus, JobStatus
from service.db.calibrations import current as current_calibration
from service.db.jobs import attempts_of
from service.db.models import Attempt, Job
from service.db.transitions import move_attempt, move_job, note_attempt
from service.settings import Settings
from workers.backends.base import BackendState, BackendStatus
from workers.disruption import requeue, retry_same_plan
from workers.escalate import escalate
from workers.health import HANG_EVIDENCE
from workers.replacement import another_cluster, move_elsewhere

log = logging.getLogger(__name__)

ACTIVE = (AttemptStatus.LAUNCHING, AttemptStatus.RUNNING)
_RUNNING = (JobStatus.LAUNCHING, JobStatus.RUNNING)


def run_ended(
    session: Session, settings: Settings, job: Job, attempt: Attempt, status: BackendStatus
) -> str | None:
    """The cluster says the attempt's processes ended (``status`` is terminal): what follows,
    carried out; the id of an attempt to launch now, if one follows at once."""
    diagnosis = None if status.state == BackendState.SUCCEEDED else diagnose(attempt, status)
    spec = JobSpec.model_validate(job.spec)
    profile = settings.cluster_profiles()[job.cluster]
    history = attempts_of(session, job.id)
    evidence = evidence_from(diagnosis.as_record(), attempt.runtime_evidence) if diagnosis else None

    def replanned() -> Replan:
        assert evidence is not None
        tried = [Candidate.model_validate(a.plan) for a in history]
        constants = current_calibration(session, job.cluster).constants  # the cluster's own
        failed = Candidate.model_validate(attempt.plan)
        return replan(spec, profile, failed, evidence, tried, constants)

    facts = Facts(
        ending=Ending(
            Phase.RUN,
            succeeded=diagnosis is None,
            failure=diagnosis.failure_class if diagnosis else None,
            lost=status.state == BackendState.LOST,
            summary=failure_summary(diagnosis, status) if diagnosis else "",
            native_state=status.native_state,
        ),
        job_cancelled=job.status == JobStatus.CANCELLED,
        stopping_for=job.stopping_for,
        kinds=tuple(AttemptKind(a.kind) for a in history),
        escalation_enabled=spec.escalation.enabled,
        max_attempts=spec.escalation.max_attempts,
        evidence=evidence.describe() if evidence else "",
        replan=replanned,
    )
    outcome = decide(facts)
    if not _record_run_end(session, job, attempt, status, diagnosis, facts.ending, outcome):
        return None  # another worker recorded this end first
    return _carry_out(session, settings, job, attempt, facts, outcome)


def launch_failed(
    session: Session, settings: Settings, job: Job, attempt: Attempt, message: str
) -> None:
    """The attempt's launch failed for good: what follows, carried out."""
    found: dict[str, Any] = {}

    def elsewhere() -> Any:
        found["relocation"] = another_cluster(session, settings, job)
        return found["relocation"].elsewhere

    facts = Facts(
        ending=Ending(Phase.LAUNCH, False, FailureClass.LAUNCH_ERROR, summary=message),
        job_cancelled=job.status == JobStatus.CANCELLED,
        stopping_for=job.stopping_for,
        kinds=tuple(AttemptKind(a.kind) for a in attempts_of(session, job.id)),
        escalation_enabled=False,
        max_attempts=0,
        replace=elsewhere,
    )
    outcome = decide(facts)
    fields = {
        "failure_class": FailureClass.LAUNCH_ERROR,
        "failure_message": message[:2000],
        "launch_cluster": job.cluster,
    }
    if not move_attempt(
        session, attempt, AttemptStatus.LAUNCHING, AttemptStatus.FAILED, message, **fields
    ):
        return
    if isinstance(outcome, Replace):
        move_elsewhere(session, settings, job, attempt, found["relocation"], message)
        log.info("job %s re-placed on %s after its launch failed", job.id, job.cluster)
    elif isinstance(outcome, Fail):
        move_job(
            session, job, JobStatus.LAUNCHING, JobStatus.FAILED,
            f"launch failed: {outcome.message}", failure_class=outcome.failure,
            message=outcome.message[:2000],
        )  # fmt: skip


def diagnose(attempt: Attempt, status: BackendStatus) -> Diagnosis:
    """Class, lines and numbers of a finished failure, the runtime's own report included; an
    attempt zeropilot stopped as hung is ``HANG`` however its processes ended."""
    if hung := attempt.failure_evidence.get(HANG_EVIDENCE):
        return Diagnosis(FailureClass.HANG, "zeropilot", (f"hung: {hung}",))
    reported = attempt.runtime_evidence.get("failure", {})
    diagnosis = diagnose_failure(
        exit_code=status.exit_code,
        native_state=status.native_state,
        reason=status.reason,
        log_tail=status.log_tail,
        runtime_tag=attempt.runtime_failure_tag,
        runtime_message=reported.get("message", ""),
        runtime_numbers=reported.get("numbers", {}),
    )
    if status.state == BackendState.LOST and diagnosis.failure_class == FailureClass.USER_ERROR:
        return replace(diagnosis, failure_class=FailureClass.NODE_LOST)
    return diagnosis


def failure_summary(diagnosis: Diagnosis, status: BackendStatus) -> str:
    """The class, how the process ended, and the line that ended it."""
    head = f"{diagnosis.failure_class}"
    line = diagnosis.line or status.reason
    if "exit code" not in line:  # else the line already says how the process ended
        ending = f"exit code {status.exit_code}" if status.exit_code is not None else ""
        if ending or status.native_state:
            head += f" ({ending or status.native_state})"
    return f"{head}: {line[:600]}" if line else head


def _record_run_end(
    session: Session,
    job: Job,
    attempt: Attempt,
    status: BackendStatus,
    diagnosis: Diagnosis | None,
    ending: Ending,
    outcome: Outcome,
) -> bool:
    """Move the attempt to how it ended; False when another worker moved it first."""
    ended = {"exit_code": status.exit_code, "native_state": status.native_state}
    if isinstance(outcome, Succeed | FinishedBeforeCancel):
        reason = f"attempt {attempt.number} exited 0"
        if isinstance(outcome, FinishedBeforeCancel):
            reason = (
                f"attempt {attempt.number} had exited 0 before the cancel of job {job.id}"
                " reached it: the run finished"
            )
        ended["exit_code"] = status.exit_code or 0
        return move_attempt(session, attempt, ACTIVE, AttemptStatus.SUCCEEDED, reason, **ended)
    if isinstance(outcome, Cancel) and not outcome.by_cluster:
        reason = _cancelled_reason(attempt)
        return move_attempt(session, attempt, ACTIVE, AttemptStatus.CANCELLED, reason, **ended)
    assert diagnosis is not None
    if isinstance(outcome, Requeue):
        return _record_preempted(session, attempt, diagnosis, ending, outcome.preemptor, ended)
    failed = ending.failure == FailureClass.PREEMPTED
    return move_attempt(
        session, attempt, ACTIVE, AttemptStatus.PREEMPTED if failed else AttemptStatus.FAILED,
        ending.summary, failure_class=ending.failure, failure_message=ending.summary[:2000],
        failure_evidence=diagnosis.as_record(), **ended,
    )  # fmt: skip


def _record_preempted(
    session: Session,
    attempt: Attempt,
    diagnosis: Diagnosis,
    ending: Ending,
    preemptor: str,
    ended: dict[str, Any],
) -> bool:
    """Stopped for another job: PREEMPTED, with whether it saved first."""
    saved = " after saving" if attempt.runtime_failure_tag == FailureClass.PREEMPTED else ""
    reason = f"preempted by job {preemptor}: stopped{saved} ({ending.summary[:300]})"
    evidence = {**attempt.failure_evidence, **diagnosis.as_record()}
    return move_attempt(
        session, attempt, ACTIVE, AttemptStatus.PREEMPTED, reason,
        failure_class=FailureClass.PREEMPTED, failure_message=reason[:2000],
        failure_evidence=evidence, **ended,
    )  # fmt: skip


def _cancelled_reason(attempt: Attempt) -> str:
    """ "job cancelled", and what the training did with its grace."""
    within = f" within its grace ({attempt.stop_grace})" if attempt.stop_grace else ""
    if attempt.runtime_failure_tag == FailureClass.PREEMPTED:  # it saved, then stopped
        return f"job cancelled: {attempt.failure_message}{within}"
    return "job cancelled"


def _carry_out(
    session: Session, settings: Settings, job: Job, attempt: Attempt, facts: Facts, outcome: Outcome
) -> str | None:
    """The job's move after its attempt's end; the id of an attempt to launch, if any."""
    ending = facts.ending
    match outcome:
        case Succeed():
            reason = f"attempt {attempt.number} exited 0"
            move_job(session, job, _RUNNING, JobStatus.SUCCEEDED, reason)
        case Cancel(by_cluster=True):
            reason = f"cancelled on the cluster: {ending.summary}"
            move_job(session, job, _RUNNING, JobStatus.CANCELLED, reason)
        case Requeue(preemptor=preemptor):
            requeue(session, settings, job, attempt, preemptor)
        case Retry(kind=kind):
            return retry_same_plan(session, settings, job, attempt, kind, ending)
        case Escalate():
            return escalate(session, settings, job, attempt, outcome, ending, facts.evidence)
        case Fail(failure=failure, message=message, note=note):
            if note:
                note_attempt(session, attempt, note)
            move_job(
                session, job, (*_RUNNING, JobStatus.ESCALATING), JobStatus.FAILED, message,
                failure_class=failure, message=message[:2000],
            )  # fmt: skip
    return None
