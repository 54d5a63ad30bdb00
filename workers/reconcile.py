"""The periodic reconcile: compare what the clusters say with what the database says, and act.

For every active attempt it polls the backend and moves job and attempt along the state
machine; a finished failure is classified, and an out-of-memory one goes up the escalation
ladder when the policy allows. It also re-sends launches that a lost task or a dead worker left
behind, and stops processes of jobs that users cancelled.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta

from sqlmodel import Session, col, select

from service.core.failures import Diagnosis, FailureClass, diagnose_failure
from service.core.spec import JobSpec
from service.core.states import AttemptStatus, JobStatus
from service.core.stopping import Grace, stop_grace
from service.db.admission import admit_pending, any_waiting
from service.db.jobs import save_durations
from service.db.models import Attempt, Job, utcnow
from service.db.session import session_scope
from service.db.transitions import move_attempt, move_job
from service.settings import Settings
from service.tasks import LAUNCH_ATTEMPT, send_task
from workers.backends import get_backend
from workers.backends.base import BackendState, BackendStatus, TemporaryError
from workers.disruption import retry_after_disruption
from workers.escalate import escalate
from workers.retention import jobs_with_unchecked_checkpoints, retain

log = logging.getLogger(__name__)

_ACTIVE_ATTEMPT = (AttemptStatus.LAUNCHING, AttemptStatus.RUNNING)


def reconcile(settings: Settings) -> None:
    try:
        for attempt_id in _admit(settings):
            send_task(settings.broker_url, LAUNCH_ATTEMPT, attempt_id)
    except Exception:  # admission failing must not stop the polling below
        log.exception("admission pass failed")
    for attempt_id in _stale_launches(settings):
        log.warning(
            "re-sending the launch of attempt %s (no progress within the lease)", attempt_id
        )
        send_task(settings.broker_url, LAUNCH_ATTEMPT, attempt_id)
    for attempt_id in _attempts_to_poll(settings):
        try:
            reconcile_attempt(settings, attempt_id)
            _FAILING.pop(attempt_id, None)
        except TemporaryError as exc:
            log.warning("poll of attempt %s deferred: %s", attempt_id, exc)
        except Exception as exc:  # one broken attempt or cluster must not stop the others'
            _log_failure(attempt_id, exc)
    _retain_checkpoints(settings)


def _retain_checkpoints(settings: Settings) -> None:
    """Retention for jobs with a checkpoint reported since the last pass (workers.retention)."""
    try:
        job_ids = jobs_with_unchecked_checkpoints(settings)
    except Exception:
        log.exception("could not look for new checkpoints")
        return
    for job_id in job_ids:
        try:
            retain(settings, job_id)
        except Exception:  # one job's storage must not stop the others' retention
            log.exception("checkpoint retention of job %s failed", job_id)


# The last failure of each attempt whose reconcile fails, by this process: a failure that
# repeats every tick is logged in full once, then in one line, not a traceback every tick.
_FAILING: dict[str, str] = {}


def _log_failure(attempt_id: str, exc: Exception) -> None:
    what = f"{type(exc).__name__}: {exc}"
    if _FAILING.get(attempt_id) == what:
        log.warning("reconcile of attempt %s still failing: %s", attempt_id, what)
        return
    if len(_FAILING) >= 10_000:  # attempts that ended while failing: forget the oldest
        del _FAILING[next(iter(_FAILING))]
    _FAILING[attempt_id] = what
    log.exception("reconcile of attempt %s failed", attempt_id)


def _admit(settings: Settings) -> list[str]:
    """Admit waiting jobs that fit now that GPUs may have been released."""
    with session_scope(settings.database_url) as session:
        if not any_waiting(session):
            return []  # the usual tick: nothing waits, and nothing is written
    with session_scope(settings.database_url) as session:  # its first statement is the write
        return admit_pending(session, settings.cluster_profiles())


def reconcile_attempt(settings: Settings, attempt_id: str) -> None:
    with session_scope(settings.database_url) as session:
        attempt = session.get(Attempt, attempt_id)
        job = session.get(Job, attempt.job_id) if attempt else None
        if attempt is None or job is None or attempt.backend_ref is None:
            return
        profile = settings.cluster_profiles()[job.cluster]
        backend = get_backend(profile.kind)
        status = backend.poll(profile, attempt.backend_ref)
        if job.status == JobStatus.CANCELLED:
            if status.state == BackendState.SUCCEEDED:
                _finished_before_cancel(session, job, attempt, status)
            elif status.state.terminal:
                move_attempt(
                    session,
                    attempt,
                    _ACTIVE_ATTEMPT,
                    AttemptStatus.CANCELLED,
                    _cancelled_reason(attempt),
                    exit_code=status.exit_code,
                    native_state=status.native_state,
                )
            else:
                grace = _stop_grace(session, settings, job)
                backend.cancel(profile, attempt.backend_ref, grace.seconds)
            return
        next_launch = _apply(session, settings, job, attempt, status)
    if next_launch:
        send_task(settings.broker_url, LAUNCH_ATTEMPT, next_launch)


def cancel_attempt(settings: Settings, attempt_id: str) -> None:
    """Stop a cancelled job's attempt on its cluster and record it."""
    with session_scope(settings.database_url) as session:
        attempt = session.get(Attempt, attempt_id)
        job = session.get(Job, attempt.job_id) if attempt else None
        if attempt is None or job is None or AttemptStatus(attempt.status).terminal:
            return
        if attempt.backend_ref is None:  # never reached the cluster
            current = AttemptStatus(attempt.status)
            move_attempt(session, attempt, current, AttemptStatus.CANCELLED, "job cancelled")
            return
        profile = settings.cluster_profiles()[job.cluster]
        grace = _stop_grace(session, settings, job)
        attempt.failure_evidence = {**attempt.failure_evidence, "stop_grace": grace.why}
        session.add(attempt)
        get_backend(profile.kind).cancel(profile, attempt.backend_ref, grace.seconds)
    # The next reconcile sees the processes gone and records the attempt as cancelled.


def _stop_grace(session: Session, settings: Settings, job: Job) -> Grace:
    configured = JobSpec.model_validate(job.spec).checkpoint.grace_s
    return stop_grace(configured, save_durations(session, job.id), settings.workers.stop_grace_s)


def _cancelled_reason(attempt: Attempt) -> str:
    """ "job cancelled", and what the training did with its grace."""
    grace = attempt.failure_evidence.get("stop_grace")
    within = f" within its grace ({grace})" if grace else ""
    if attempt.runtime_failure_tag == FailureClass.PREEMPTED:  # it saved, then stopped
        return f"job cancelled: {attempt.failure_message}{within}"
    return "job cancelled"


def _finished_before_cancel(
    session: Session, job: Job, attempt: Attempt, status: BackendStatus
) -> None:
    """The run exited 0 before the cancel reached it: the job stays CANCELLED (an ended job
    never moves) and its attempt says the run finished, so its last checkpoint is whole."""
    move_attempt(
        session,
        attempt,
        _ACTIVE_ATTEMPT,
        AttemptStatus.SUCCEEDED,
        f"attempt {attempt.number} had exited 0 before the cancel of job {job.id} reached it:"
        " the run finished",
        exit_code=status.exit_code or 0,
        native_state=status.native_state,
    )


def _apply(
    session: Session, settings: Settings, job: Job, attempt: Attempt, status: BackendStatus
) -> str | None:
    """Move job and attempt to match the backend; return an attempt id to launch, if any."""
    if status.state == BackendState.PENDING:
        _note_pending(session, attempt, status)
    elif status.state == BackendState.RUNNING:
        _mark_running(session, job, attempt, status)
    elif status.state == BackendState.SUCCEEDED:
        _mark_succeeded(session, job, attempt, status)
    else:
        return _mark_failed(session, settings, job, attempt, status)
    return None


def _note_pending(session: Session, attempt: Attempt, status: BackendStatus) -> None:
    if (attempt.native_state, attempt.failure_message) != (status.native_state, status.reason):
        attempt.native_state = status.native_state
        attempt.failure_message = status.reason  # e.g. Slurm's pending reason, shown to the user
        session.add(attempt)


def _mark_running(session: Session, job: Job, attempt: Attempt, status: BackendStatus) -> None:
    native = status.native_state
    detail = f" ({native})" if native and native.lower() != "running" else ""
    reason = f"attempt {attempt.number} running{detail}"
    move_attempt(
        session,
        attempt,
        AttemptStatus.LAUNCHING,
        AttemptStatus.RUNNING,
        reason,
        native_state=status.native_state,
        failure_message="",
    )
    move_job(session, job, JobStatus.LAUNCHING, JobStatus.RUNNING, reason)


def _mark_succeeded(session: Session, job: Job, attempt: Attempt, status: BackendStatus) -> None:
    reason = f"attempt {attempt.number} exited 0"
    move_attempt(
        session,
        attempt,
        _ACTIVE_ATTEMPT,
        AttemptStatus.SUCCEEDED,
        reason,
        exit_code=status.exit_code or 0,
        native_state=status.native_state,
    )
    move_job(session, job, (JobStatus.LAUNCHING, JobStatus.RUNNING), JobStatus.SUCCEEDED, reason)


def _mark_failed(
    session: Session, settings: Settings, job: Job, attempt: Attempt, status: BackendStatus
) -> str | None:
    diagnosis = diagnose(attempt, status)
    failure = diagnosis.failure_class
    summary = _failure_summary(diagnosis, status)
    ended = AttemptStatus.PREEMPTED if failure == FailureClass.PREEMPTED else AttemptStatus.FAILED
    moved = move_attempt(
        session,
        attempt,
        _ACTIVE_ATTEMPT,
        ended,
        summary,
        exit_code=status.exit_code,
        native_state=status.native_state,
        failure_class=failure,
        failure_message=summary[:2000],
        failure_evidence=diagnosis.as_record(),
    )
    if not moved:
        return None
    if retry := retry_after_disruption(session, settings, job, attempt, failure, status, summary):
        return retry  # a node taken away: the same plan again, not counted against the user
    spec = JobSpec.model_validate(job.spec)
    profile = settings.cluster_profiles()[job.cluster]
    if failure.out_of_memory and spec.escalation.enabled:
        next_attempt, why_not = escalate(session, settings, job, attempt, spec, profile, diagnosis)
        if next_attempt is not None:
            return next_attempt
        summary = f"{summary}; {why_not}" if why_not else summary
    if failure == FailureClass.CANCELLED:
        move_job(
            session,
            job,
            (JobStatus.LAUNCHING, JobStatus.RUNNING),
            JobStatus.CANCELLED,
            f"cancelled on the cluster: {summary}",
        )
        return None
    move_job(
        session,
        job,
        (JobStatus.LAUNCHING, JobStatus.RUNNING, JobStatus.ESCALATING),
        JobStatus.FAILED,
        summary,
        failure_class=failure,
        message=summary[:2000],
    )
    return None


def diagnose(attempt: Attempt, status: BackendStatus) -> Diagnosis:
    """Class, lines and numbers of a finished failure, the runtime's own report included."""
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


def _failure_summary(diagnosis: Diagnosis, status: BackendStatus) -> str:
    """The class, how the process ended, and the line that ended it."""
    head = f"{diagnosis.failure_class}"
    line = diagnosis.line or status.reason
    if "exit code" not in line:  # else the line already says how the process ended
        ending = f"exit code {status.exit_code}" if status.exit_code is not None else ""
        if ending or status.native_state:
            head += f" ({ending or status.native_state})"
    return f"{head}: {line[:600]}" if line else head


def _attempts_to_poll(settings: Settings) -> list[str]:
    with session_scope(settings.database_url) as session:
        query = select(Attempt.id).where(
            col(Attempt.status).in_(_ACTIVE_ATTEMPT), col(Attempt.backend_ref).is_not(None)
        )
        return list(session.exec(query).all())


def _stale_launches(settings: Settings) -> list[str]:
    """Attempts of QUEUED/LAUNCHING jobs that have had no backend reference for a lease."""
    cutoff = utcnow() - timedelta(seconds=settings.workers.launch_lease_s)
    with session_scope(settings.database_url) as session:
        query = (
            select(Attempt.id, Job.id)
            .join(Job, col(Job.id) == Attempt.job_id)
            .where(
                col(Job.status).in_((JobStatus.QUEUED, JobStatus.LAUNCHING)),
                Job.current_attempt == Attempt.number,
                col(Attempt.backend_ref).is_(None),
                col(Job.updated_at) < cutoff,
            )
        )
        rows = session.exec(query).all()
        for _attempt_id, job_id in rows:  # touch: one re-send per lease, not one per tick
            job = session.get(Job, job_id)
            if job is not None:
                job.updated_at = utcnow()
                session.add(job)
        return [attempt_id for attempt_id, _job_id in rows]
