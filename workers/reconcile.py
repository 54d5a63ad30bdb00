"""The periodic reconcile: compare what the clusters say with what the database says, and act.

It polls the active attempts cluster by cluster, each cluster in one ``poll_many`` (a constant
number of cluster calls, whatever the number of attempts), reads them all from the database in
one query, and opens a session only for the attempts whose status changed; it moves job and
attempt along the state machine; a finished failure is classified, and an out-of-memory one
goes up the escalation ladder when the policy allows. It also re-sends launches that a lost
task or a dead worker left behind, and stops processes of jobs that users cancelled. One pass
runs at a time across every worker (``service.db.reconcile_lease``).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from datetime import timedelta

from sqlmodel import Session, col, select

from service.core.clusters import ClusterProfile
from service.core.preemption import Policy
from service.core.spec import JobSpec
from service.core.states import AttemptStatus, JobStatus
from service.core.stopping import stop_grace
from service.db.admission import admit_pending, any_waiting
from service.db.jobs import save_durations
from service.db.models import Attempt, Job, new_id, utcnow
from service.db.preemption import Stop, choose_stops
from service.db.reconcile_lease import release_lease, take_lease
from service.db.session import session_scope
from service.db.transitions import move_attempt, move_job, note_attempt
from service.metrics import (
    RECONCILE_ATTEMPTS_POLLED,
    RECONCILE_CLUSTER_CALLS,
    RECONCILE_POLL_SECONDS,
)
from service.settings import Settings
from service.tasks import LAUNCH_ATTEMPT, send_task
from workers.backends import get_backend
from workers.backends.base import BackendState, BackendStatus, TemporaryError
from workers.backends.calls import calls_sent
from workers.cluster_bounds import read_cluster_bounds
from workers.health import HANG_EVIDENCE, ask_for_stacks, find_hung
from workers.outcomes import run_ended
from workers.retention import jobs_with_unchecked_checkpoints, retain
from workers.waiting_placement import replace_waiting
from workers.watched import (
    ACTIVE_ATTEMPT,
    PollCounts,
    Watched,
    active_attempts,
    pending_note,
    unchanged,
    write_pending_notes,
)

log = logging.getLogger(__name__)

_ACTIVE_ATTEMPT = ACTIVE_ATTEMPT
# The lease outlasts a few beats, so a slow pass keeps it between renewals; a lost worker's
# lapses within that.
LEASE_INTERVALS = 5
LEASE_MIN_S = 15.0


def reconcile(settings: Settings) -> None:
    """One pass, unless another worker's pass holds the lease."""
    holder = new_id()
    if not _renew_lease(settings, holder):
        log.info("reconcile pass skipped: another worker's pass holds the lease")
        return
    try:
        _reconcile_pass(settings, holder)
    finally:
        with session_scope(settings.database_url) as session:
            release_lease(session, holder)


def _reconcile_pass(settings: Settings, holder: str) -> None:
    started = time.monotonic()
    try:
        read_cluster_bounds(settings)
    except Exception:  # a bound unread keeps the last one; the pass goes on
        log.exception("reading the clusters' GPU limits failed")
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
    counts = _poll_clusters(settings, holder)
    _stop_hung(settings)
    _retain_checkpoints(settings)
    _report_pass(settings, time.monotonic() - started, counts)


def _poll_clusters(settings: Settings, holder: str) -> list[PollCounts]:
    """Each cluster's active attempts polled in one ``poll_many``, then applied one by one."""
    by_cluster: dict[str, list[Watched]] = defaultdict(list)
    for watched in active_attempts(settings):
        by_cluster[watched.cluster].append(watched)
    profiles = settings.cluster_profiles()
    counts = []
    for cluster, group in by_cluster.items():
        if not _renew_lease(settings, holder):  # lapsed mid-pass: another pass goes on
            log.warning("reconcile pass stopped: its lease lapsed before cluster %s", cluster)
            break
        counts.append(_poll_cluster(settings, profiles.get(cluster), cluster, group))
    return counts


def _poll_cluster(
    settings: Settings, profile: ClusterProfile | None, cluster: str, group: list[Watched]
) -> PollCounts:
    started = time.monotonic()
    kind = profile.kind if profile is not None else "unknown"
    calls_before = calls_sent(kind)
    statuses: dict[str, BackendStatus] = {}
    try:
        if profile is not None:  # else each attempt's own reconcile says why it cannot poll
            statuses = get_backend(kind).poll_many(profile, [w.ref for w in group])
    except TemporaryError as exc:
        log.warning("poll of cluster %s deferred (%d attempts): %s", cluster, len(group), exc)
        return PollCounts(kind, len(group), calls_sent(kind) - calls_before, 0.0)
    except Exception as exc:  # one broken cluster must not stop the others'
        _log_failure(f"of cluster {cluster}", exc)
        return PollCounts(kind, len(group), calls_sent(kind) - calls_before, 0.0)
    notes = []
    for watched in group:
        status = statuses.get(watched.ref)  # missing: its own poll, which raises what failed
        if status is not None and unchanged(watched, status):
            _FAILING.pop(watched.attempt_id, None)
            continue  # nothing to write: no session for it
        if status is not None and (note := pending_note(watched, status)) is not None:
            notes.append(note)  # written with the others below
            continue
        _reconcile_one(settings, watched.attempt_id, status)
    try:
        write_pending_notes(settings, notes)
    except Exception as exc:  # the next pass writes them again
        _log_failure(f"of the pending reasons of cluster {cluster}", exc)
    return PollCounts(kind, len(group), calls_sent(kind) - calls_before, time.monotonic() - started)


def _reconcile_one(settings: Settings, attempt_id: str, status: BackendStatus | None) -> None:
    try:
        reconcile_attempt(settings, attempt_id, status)
        _FAILING.pop(attempt_id, None)
    except TemporaryError as exc:
        log.warning("poll of attempt %s deferred: %s", attempt_id, exc)
    except Exception as exc:  # one broken attempt or cluster must not stop the others'
        _log_failure(f"of attempt {attempt_id}", exc, attempt_id)


def _renew_lease(settings: Settings, holder: str) -> bool:
    lease_s = max(LEASE_MIN_S, LEASE_INTERVALS * settings.workers.reconcile_interval_s)
    with session_scope(settings.database_url) as session:
        return take_lease(session, holder, time.time(), lease_s)


def _report_pass(settings: Settings, seconds: float, counts: list[PollCounts]) -> None:
    """Metrics by backend kind; a pass longer than the beat's interval is logged with why."""
    for kind in {c.backend for c in counts}:
        mine = [c for c in counts if c.backend == kind]
        RECONCILE_POLL_SECONDS.labels(kind).observe(sum(c.seconds for c in mine))
        RECONCILE_ATTEMPTS_POLLED.labels(kind).observe(sum(c.attempts for c in mine))
        RECONCILE_CLUSTER_CALLS.labels(kind).observe(sum(c.calls for c in mine))
    interval = settings.workers.reconcile_interval_s
    if seconds > interval:
        log.warning(
            "reconcile pass took %.2f s, over its %.1f s interval: %d attempts on %d clusters"
            " polled with %d cluster calls (%s)",
            seconds,
            interval,
            sum(c.attempts for c in counts),
            len(counts),
            sum(c.calls for c in counts),
            ", ".join(f"{c.backend}: {c.attempts} in {c.seconds:.2f} s" for c in counts),
        )


def _stop_hung(settings: Settings) -> None:
    """Running attempts that stopped making progress: their stacks asked for, then stopped
    (workers.health); one broken attempt must not stop the others'."""
    try:
        hung = find_hung(settings)
    except Exception:
        log.exception("the hang watch failed")
        return
    for attempt_id in hung:
        try:
            with session_scope(settings.database_url) as session:
                attempt = session.get(Attempt, attempt_id)
                job = session.get(Job, attempt.job_id) if attempt else None
                if attempt is None or job is None:
                    continue
                stacks = ask_for_stacks(settings, attempt, job)
                why = attempt.failure_evidence.get(HANG_EVIDENCE, "")
                note_attempt(session, attempt, f"hung: {why}; {stacks}; stopping it")
                send_stop(session, settings, job, attempt)
        except Exception as exc:
            _log_failure(f"of hung attempt {attempt_id}", exc, attempt_id)


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


def _log_failure(subject: str, exc: Exception, key: str | None = None) -> None:
    """``subject``: "of attempt <id>" or "of cluster <name>"."""
    key = key or subject
    what = f"{type(exc).__name__}: {exc}"
    if _FAILING.get(key) == what:
        log.warning("reconcile %s still failing: %s", subject, what)
        return
    if len(_FAILING) >= 10_000:  # attempts that ended while failing: forget the oldest
        del _FAILING[next(iter(_FAILING))]
    _FAILING[key] = what
    log.exception("reconcile %s failed", subject)


def _admit(settings: Settings) -> list[str]:
    """Admit waiting jobs that fit now that GPUs may have been released; with preemption on,
    stop the running jobs that the first job still waiting needs (docs/scheduling.md)."""
    with session_scope(settings.database_url) as session:
        if not any_waiting(session):
            return []  # the usual tick: nothing waits, and nothing is written
    sharing = settings.scheduling
    profiles = settings.cluster_profiles()
    with session_scope(settings.database_url) as session:  # its first statement is the write
        admitting = (profiles, sharing.borrowing, sharing.borrow_backoff_s, sharing.backfill_margin)
        launches = admit_pending(session, *admitting)
        if replace_waiting(session, settings):  # moved where GPUs may be free: admit them now
            launches += admit_pending(session, *admitting)
        stops: list[Stop] = []
        if sharing.preemption:
            policy = Policy(sharing.min_runtime_s, sharing.preempt_across_teams)
            stops = choose_stops(session, profiles, policy, sharing.borrowing, utcnow())
    for stop in stops:  # marked and committed first: a worker lost here is redone by the poll
        log.info("preempting job %s: %s", stop.job_id, stop.reason)
        _stop_victim(settings, stop.attempt_id)
    return launches


def attempt_ended(settings: Settings, attempt_id: str) -> None:
    """An attempt's processes said they ended: record it now (the pass would, a beat later),
    then admit what its GPUs let start. Moves are compare-and-set, so a pass applying the same
    end at the same moment writes it once."""
    reconcile_attempt(settings, attempt_id)
    for launch_id in _admit(settings):
        send_task(settings.broker_url, LAUNCH_ATTEMPT, launch_id)


def _stop_victim(settings: Settings, attempt_id: str) -> None:
    """The graceful stop (SIGTERM, a save, SIGKILL after the grace) of a preemption's victim."""
    with session_scope(settings.database_url) as session:
        attempt = session.get(Attempt, attempt_id)
        job = session.get(Job, attempt.job_id) if attempt else None
        if attempt is None or job is None or attempt.backend_ref is None:
            return
        send_stop(session, settings, job, attempt)


def reconcile_attempt(
    settings: Settings, attempt_id: str, status: BackendStatus | None = None
) -> None:
    """Move one attempt and its job to match ``status`` (the pass's ``poll_many`` answer), or,
    without one, what a poll of the attempt alone says."""
    with session_scope(settings.database_url) as session:
        attempt = session.get(Attempt, attempt_id)
        job = session.get(Job, attempt.job_id) if attempt else None
        if attempt is None or job is None or attempt.backend_ref is None:
            return
        profile = settings.cluster_profiles()[job.cluster]
        backend = get_backend(profile.kind)
        if status is None:
            status = backend.poll(profile, attempt.backend_ref)
        next_launch = None
        if status.state.terminal:  # what follows is service.core.outcomes' to decide
            next_launch = run_ended(session, settings, job, attempt, status)
        else:
            if stopping(job, attempt):  # the stop goes on
                send_stop(session, settings, job, attempt)
            if job.status != JobStatus.CANCELLED:
                _follow(session, job, attempt, status)
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
        send_stop(session, settings, job, attempt)
    # The next reconcile sees the processes gone and records the attempt as cancelled.


def send_stop(session: Session, settings: Settings, job: Job, attempt: Attempt) -> None:
    """The graceful stop (SIGTERM, a save, SIGKILL after the grace): for a cancel or a
    preemption, sent again by each pass until the attempt has ended (a backend takes it twice
    as once). The grace it chose is kept on the attempt, for the reason its end will give."""
    if attempt.stop_grace_s is None:  # the first time: the grace holds from the first SIGTERM on
        configured = JobSpec.model_validate(job.spec).checkpoint.grace_s
        durations = save_durations(session, job.id)
        grace = stop_grace(configured, durations, settings.workers.stop_grace_s)
        attempt.stop_grace_s, attempt.stop_grace = grace.seconds, grace.why
        session.add(attempt)
    assert attempt.backend_ref is not None
    profile = settings.cluster_profiles()[job.cluster]
    get_backend(profile.kind).cancel(profile, attempt.backend_ref, attempt.stop_grace_s)


def stopping(job: Job, attempt: Attempt) -> bool:
    """Whether zeropilot is stopping the attempt: its job cancelled or preempted, or a stop it
    began of its own (a hang), which each pass sends again until the attempt has ended."""
    stopped = job.status == JobStatus.CANCELLED or bool(job.stopping_for)
    return stopped or attempt.stop_grace_s is not None


def _follow(session: Session, job: Job, attempt: Attempt, status: BackendStatus) -> None:
    """A run that goes on: why it waits, or that it runs now."""
    if status.state == BackendState.PENDING:
        _note_pending(session, attempt, status)
    elif status.state == BackendState.RUNNING:
        _mark_running(session, job, attempt, status)


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
