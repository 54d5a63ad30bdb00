"""A running attempt's checkpoint interval, read from the job's saves and its cluster's history.

The interval an attempt should save at is kept in its ``runtime_evidence`` (no column of its
own): set on its first metrics report, recomputed at each save it reports; the runtime learns
it from the answer to each metrics report. A change is an event with its reason.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from datetime import datetime, timedelta

from sqlmodel import Session, col, select

from service.core.cadence import (
    HISTORY_DAYS,
    RECENT_SAVES,
    Cadence,
    Interruptions,
    first_cadence,
    fixed,
    resolve_setting,
    worth_changing,
    young_cadence,
)
from service.core.clusters import ClusterProfile
from service.core.failures import FailureClass
from service.core.goodput import HANG_CLASS
from service.core.spec import AUTO_INTERVAL
from service.db.goodput import measured_pace
from service.db.models import Attempt, Checkpoint, Job, as_utc, utcnow
from service.db.transitions import note_attempt

INTERVAL_KEY = "checkpoint_interval"  # in Attempt.runtime_evidence: {"steps", "reason"}
# The cluster's failures, not the job's: a node lost, a collective failed or hung.
INTERRUPTING = frozenset(
    {FailureClass.NODE_LOST, FailureClass.NCCL_TIMEOUT, FailureClass.NCCL_ERROR, HANG_CLASS}
)


def interruptions(session: Session, cluster: str, now: datetime) -> Interruptions:
    """GPU-hours zeropilot's attempts ran on ``cluster`` in the last ``HISTORY_DAYS``, and
    how many of them the cluster interrupted."""
    since = now - timedelta(days=HISTORY_DAYS)
    query = (
        select(Attempt.started_at, Attempt.finished_at, Attempt.failure_class, Job.gpus)
        .join(Job, col(Job.id) == col(Attempt.job_id))
        .where(Job.cluster == cluster, col(Attempt.started_at).is_not(None))
        .where(col(Attempt.finished_at).is_(None) | (col(Attempt.finished_at) >= since))
    )
    seconds, count = 0.0, 0
    for started, finished, failure, gpus in session.exec(query):
        if started is None:  # excluded by the query; the type does not know
            continue
        end = as_utc(finished) if finished else now
        seconds += max(0.0, (end - max(as_utc(started), since)).total_seconds()) * gpus
        count += failure in INTERRUPTING
    return Interruptions(seconds / 3600.0, count)


def recent_save_s(session: Session, job_id: str) -> float | None:
    query = (
        select(Checkpoint.save_seconds)
        .where(Checkpoint.job_id == job_id, col(Checkpoint.save_seconds).is_not(None))
        .order_by(col(Checkpoint.id).desc())
        .limit(RECENT_SAVES)
    )
    found = [s for s in session.exec(query).all() if s is not None]
    return statistics.median(found) if found else None


def step_seconds(session: Session, job: Job) -> float | None:
    """One step's time at the job's measured pace, else at the plan's predicted one."""
    training = job.spec.get("training", {})
    tokens = training.get("global_batch_size", 0) * training.get("sequence_length", 0)
    pace = measured_pace(session, job.id)
    return tokens / pace if pace and tokens else job.step_s


def job_cadence(session: Session, job: Job, profile: ClusterProfile | None) -> Cadence:
    setting = resolve_setting(job.spec.get("checkpoint", {}).get("interval_steps"), profile)
    if setting != AUTO_INTERVAL:
        return fixed(int(setting))
    step_s, save_s = step_seconds(session, job), recent_save_s(session, job.id)
    if save_s is None or not step_s:
        return first_cadence(step_s, job.steps)
    seen = interruptions(session, job.cluster, utcnow())
    return young_cadence(save_s, step_s, job.gpus, seen, job.steps)


def stored_interval(attempt: Attempt) -> int | None:
    stored = attempt.runtime_evidence.get(INTERVAL_KEY) or {}
    steps = stored.get("steps")
    return int(steps) if steps else None


def refresh_interval(
    session: Session, attempt: Attempt, profiles: Mapping[str, ClusterProfile]
) -> int:
    """Compute the attempt's interval now and keep it; an event says why when it changes."""
    job = session.get(Job, attempt.job_id)
    assert job is not None
    cadence = job_cadence(session, job, profiles.get(job.cluster))
    session.refresh(attempt, with_for_update=True)  # ranks' reports land at once: no lost update
    current = stored_interval(attempt)
    if not worth_changing(current, cadence):
        return current or cadence.steps
    kept = {"steps": cadence.steps, "reason": cadence.reason}
    attempt.runtime_evidence = {**attempt.runtime_evidence, INTERVAL_KEY: kept}  # a new dict
    session.add(attempt)
    if cadence.automatic:  # a set interval needs no explaining
        note_attempt(session, attempt, f"checkpoint {cadence.reason}")
    return cadence.steps
