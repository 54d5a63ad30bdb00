"""Prometheus metrics that the API and the workers record, for the people who operate zeropilot.

Every process records into prometheus-client's default registry; when
``PROMETHEUS_MULTIPROC_DIR`` is set (``zeropilot up`` and the Helm chart set it) the values live
in files there, so the API's ``/metrics`` adds up what every API and worker process of the host
or pod recorded. The variable must be set before this module is first imported.

Job and attempt counters are not incremented where the status changes: a listener on every
database session collects the ``JobEvent`` rows a transaction writes and counts them only once it
has committed, so a rolled-back or lost compare-and-set is never counted.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, multiprocess
from sqlalchemy import event
from sqlalchemy.orm import Session
from sqlmodel import Session as ModelSession
from sqlmodel import col, select

from service.core.failures import FailureClass
from service.core.goodput import tally
from service.core.states import AttemptStatus, JobStatus
from service.db.goodput import job_timeline
from service.db.jobs import NEW_JOB_EVENTS
from service.db.models import Attempt, Job, JobEvent, Team

log = logging.getLogger(__name__)

# Seconds from a few ms (an API call) to hours (a job waiting for GPUs).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)

JOBS_SUBMITTED = Counter(
    "zeropilot_jobs_submitted_total", "Jobs stored by the API.", ["cluster", "team"]
)
JOBS_ADMITTED = Counter(
    "zeropilot_jobs_admitted_total", "Jobs admitted from PENDING to QUEUED.", ["cluster", "team"]
)
JOBS_FINISHED = Counter(
    "zeropilot_jobs_finished_total",
    "Jobs that ended, by final status (SUCCEEDED, FAILED, CANCELLED).",
    ["cluster", "status"],
)
JOB_STATUS_CHANGES = Counter(
    "zeropilot_job_status_changes_total", "Job status transitions.", ["cluster", "status"]
)
ATTEMPTS_LAUNCHED = Counter(
    "zeropilot_attempts_launched_total",
    "Attempts a backend accepted (submitted to a cluster).",
    ["cluster", "backend"],
)
ATTEMPTS_FAILED = Counter(
    "zeropilot_attempts_failed_total", "Attempts that failed.", ["cluster", "failure_class"]
)
ATTEMPTS_PREEMPTED = Counter(
    "zeropilot_attempts_preempted_total",
    "Attempts stopped from outside after saving; the job went on from that checkpoint.",
    ["cluster"],
)
CHECKPOINT_BYTES_DELETED = Counter(
    "zeropilot_checkpoint_bytes_deleted_total",
    "Bytes of checkpoints that retention (checkpoint.keep_last, ...) deleted.",
    ["cluster"],
)
JOB_CHECKPOINT_BYTES = Gauge(
    "zeropilot_job_checkpoint_bytes",
    "Bytes of each job's kept checkpoints, as the worker's last retention pass measured them.",
    ["job", "team"],
    multiprocess_mode="mostrecent",
)
ESCALATIONS = Counter(
    "zeropilot_escalations_total",
    "Jobs sent one rung up the memory ladder after a failure.",
    ["cluster", "failure_class"],
)
GPU_SECONDS = Counter(
    "zeropilot_gpu_seconds_total",
    "GPU-seconds that ended jobs held, by cause: productive, or what lost them (startup, "
    "checkpointing, redone, hang, stop_save, ending; docs/goodput.md). Counted as a job ends.",
    ["cluster", "team", "cause"],
)
QUEUE_WAIT = Histogram(
    "zeropilot_queue_wait_seconds",
    "Time from submission to admission.",
    ["team"],
    buckets=WAIT_BUCKETS,
)
START_PREDICTION_ERROR = Histogram(
    "zeropilot_start_prediction_error_seconds",
    "How far a job's admission was from its first predicted start while it waited: late or"
    " early (docs/scheduling.md, predicted starts).",
    ["cluster", "direction"],
    buckets=WAIT_BUCKETS,
)
SUBMIT_TO_RUNNING = Histogram(
    "zeropilot_submit_to_running_seconds",
    "Time from submission until the first attempt runs.",
    ["cluster"],
    buckets=WAIT_BUCKETS,
)
HTTP_REQUESTS = Histogram(
    "zeropilot_http_request_duration_seconds",
    "API request handling time, by route template.",
    ["method", "route", "status"],
    buckets=LATENCY_BUCKETS,
)
ADVISOR_SECONDS = Histogram(
    "zeropilot_advisor_duration_seconds",
    "Time the advisor took to plan a job (POST /v1/advice and job submission).",
    ["route"],
    buckets=LATENCY_BUCKETS,
)
TASK_SECONDS = Histogram(
    "zeropilot_worker_task_duration_seconds",
    "Celery task run time.",
    ["task"],
    buckets=LATENCY_BUCKETS,
)
TASK_FAILURES = Counter(
    "zeropilot_worker_task_failures_total", "Celery tasks that raised.", ["task"]
)
RECONCILE_SECONDS = Histogram(
    "zeropilot_reconcile_duration_seconds",
    "Duration of one reconcile pass (admission, stale launches, polls).",
    buckets=LATENCY_BUCKETS,
)
# Counts per pass, from one attempt to tens of thousands.
COUNT_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
RECONCILE_POLL_SECONDS = Histogram(
    "zeropilot_reconcile_poll_duration_seconds",
    "Time one reconcile pass spent polling and applying the attempts of one backend kind.",
    ["backend"],
    buckets=LATENCY_BUCKETS,
)
RECONCILE_ATTEMPTS_POLLED = Histogram(
    "zeropilot_reconcile_attempts_polled",
    "Active attempts one reconcile pass polled, by backend kind.",
    ["backend"],
    buckets=COUNT_BUCKETS,
)
RECONCILE_CLUSTER_CALLS = Histogram(
    "zeropilot_reconcile_cluster_calls",
    "Requests to clusters (Kubernetes API requests, Slurm commands) in one reconcile pass.",
    ["backend"],
    buckets=COUNT_BUCKETS,
)
RECONCILE_LAST_PASS = Gauge(
    "zeropilot_reconcile_last_pass_timestamp_seconds",
    "Unix time at which the last reconcile pass ended; lag is time() minus this.",
    multiprocess_mode="max",
)


def process_registry() -> CollectorRegistry:
    """What this process serves: every process's values when they share a folder, else its own."""
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry


@dataclass(frozen=True)
class _Seen:
    """What one committed JobEvent means for the metrics, resolved before the commit."""

    subject: str
    from_status: str | None
    to_status: str
    reason: str
    cluster: str
    team: str
    failure_class: str | None
    since_submit_s: float
    attempt_number: int | None
    start_error_s: float | None = None  # on admission: against its first predicted start
    gpu_seconds: tuple[tuple[str, float], ...] = ()  # an ended job's, by cause


def install_transition_metrics() -> None:
    """Count committed job events in this process (idempotent)."""
    for name, listener in _LISTENERS.items():
        if not event.contains(Session, name, listener):
            event.listen(Session, name, listener)


def _plain_rows_seen(session: Session) -> list[_Seen]:
    """The events of jobs written as plain rows (``service.db.jobs.store_job``)."""
    return [
        _Seen(
            subject=e["subject"],
            from_status=e["from_status"],
            to_status=e["to_status"],
            reason=e["reason"],
            cluster=cluster,
            team=team,
            failure_class=None,
            since_submit_s=0.0,  # written with the job
            attempt_number=e["attempt_number"],
        )
        for events, cluster, team in session.info.pop(NEW_JOB_EVENTS, [])
        for e in events
    ]


def _collect(session: Session, _context: Any) -> None:
    events = [obj for obj in session.new if isinstance(obj, JobEvent)]
    if events:
        session.info.setdefault("zeropilot_events", []).extend(events)


def _resolve(session: Session) -> None:
    """Turn the transaction's events into label values while the session can still read."""
    try:
        session.flush()
        events: list[JobEvent] = session.info.pop("zeropilot_events", [])
        session.info.setdefault("zeropilot_seen", []).extend(_seen(session, e) for e in events)
    except Exception:  # a metric must never stop a transition
        log.exception("could not read job events for the metrics")
        session.info.pop("zeropilot_seen", None)


def _seen(session: Session, row: JobEvent) -> _Seen:
    job = session.get(Job, row.job_id)
    team = session.get(Team, job.team_id) if job else None
    failure = None
    if row.subject == "attempt" and row.to_status == AttemptStatus.FAILED:
        query = select(col(Attempt.failure_class)).where(
            Attempt.job_id == row.job_id, Attempt.number == row.attempt_number
        )
        failure = session.execute(query).scalar()
    created = job.created_at if job else datetime.now(UTC)
    if created.tzinfo is None:  # SQLite returns naive UTC
        created = created.replace(tzinfo=UTC)
    return _Seen(
        subject=row.subject,
        from_status=row.from_status,
        to_status=row.to_status,
        reason=row.reason,
        cluster=job.cluster if job else "",
        team=team.name if team else "",
        failure_class=failure,
        since_submit_s=max(0.0, (datetime.now(UTC) - created).total_seconds()),
        attempt_number=row.attempt_number,
        start_error_s=job.start_prediction_error_s if job else None,
        gpu_seconds=_ended_job_gpu_seconds(session, job, row),
    )


def _ended_job_gpu_seconds(
    session: Session, job: Job | None, row: JobEvent
) -> tuple[tuple[str, float], ...]:
    """An ended job's GPU-seconds by cause, read once, as it ends (an attempt still stopping
    counts up to its latest report)."""
    if job is None or row.subject != "job" or not JobStatus(row.to_status).terminal:
        return ()
    if not isinstance(session, ModelSession):  # every zeropilot session is one
        return ()
    counted = tally(job_timeline(session, job).segments)
    return tuple((cause.value, seconds) for cause, seconds in counted.by_cause.items())


def _record(session: Session) -> None:
    for seen in [*session.info.pop("zeropilot_seen", []), *_plain_rows_seen(session)]:
        try:
            _count(seen)
        except Exception:
            log.exception("could not record metrics for a job event")


def _forget(session: Session, *_args: Any) -> None:
    session.info.pop(NEW_JOB_EVENTS, None)
    session.info.pop("zeropilot_events", None)
    session.info.pop("zeropilot_seen", None)


def _count(seen: _Seen) -> None:
    if seen.subject not in ("job", "attempt"):  # a deletion, not a status change
        return
    if seen.subject == "attempt":
        if seen.to_status == AttemptStatus.FAILED:
            ATTEMPTS_FAILED.labels(seen.cluster, seen.failure_class or "UNKNOWN").inc()
        elif seen.to_status == AttemptStatus.PREEMPTED:
            ATTEMPTS_PREEMPTED.labels(seen.cluster).inc()
        return
    if seen.from_status == seen.to_status:  # a decision (a preemption), not a change
        return
    status = seen.to_status
    JOB_STATUS_CHANGES.labels(seen.cluster, status).inc()
    if seen.from_status is None:
        JOBS_SUBMITTED.labels(seen.cluster, seen.team).inc()
    elif seen.from_status == JobStatus.PENDING and status == JobStatus.QUEUED:
        JOBS_ADMITTED.labels(seen.cluster, seen.team).inc()
        QUEUE_WAIT.labels(seen.team).observe(seen.since_submit_s)
        _observe_start_error(seen)
    elif status == JobStatus.RUNNING and seen.attempt_number == 1:
        SUBMIT_TO_RUNNING.labels(seen.cluster).observe(seen.since_submit_s)
    elif status == JobStatus.ESCALATING:
        ESCALATIONS.labels(seen.cluster, _escalation_class(seen.reason)).inc()
    if JobStatus(status).terminal:
        JOBS_FINISHED.labels(seen.cluster, status).inc()
        for cause, seconds in seen.gpu_seconds:
            GPU_SECONDS.labels(seen.cluster, seen.team, cause).inc(seconds)


def _observe_start_error(seen: _Seen) -> None:
    if seen.start_error_s is None:
        return
    direction = "late" if seen.start_error_s >= 0 else "early"
    START_PREDICTION_ERROR.labels(seen.cluster, direction).observe(abs(seen.start_error_s))


def _escalation_class(reason: str) -> str:
    """workers.escalate writes the ESCALATING reason as '<failure class>: <rung>'."""
    head = reason.split(":", 1)[0].strip()
    return head if head in FailureClass.__members__ else "UNKNOWN"


_LISTENERS: dict[str, Callable[..., None]] = {
    "after_flush": _collect,
    "before_commit": _resolve,
    "after_commit": _record,
    "after_soft_rollback": _forget,
}
