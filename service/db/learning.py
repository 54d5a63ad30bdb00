"""Observations: one row per ended attempt, what the advisor predicted and what it measured.

``record_ended`` looks at every ended attempt once (in batches): its steady step time from the
stored ``tokens_per_s`` points (``service.core.observing``'s rule), rank 0's reported peak and
how many other attempts shared its device. An attempt not learnt from still gets its row, with
``skipped`` saying why, so it is not looked at again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from sqlmodel import Session, col, func, or_, select

from service.core.advisor.models import Candidate
from service.core.advisor.workload import runs_on_cpu
from service.core.clusters import BackendKind, ClusterProfile
from service.core.escalation import CONTEXT_ALLOWANCE
from service.core.observing import Measured, measure, peak_kind
from service.core.spec import JobSpec
from service.core.states import AttemptStatus
from service.db.models import Attempt, AttemptObservation, Job, MetricPoint, as_utc
from zeropilot.runtime import RESERVED_PEAK_KEY

BATCH = 200  # attempts looked at per pass; the rest in the next
_ENDED = [s.value for s in AttemptStatus if s.terminal]


def record_ended(session: Session, profiles: Mapping[str, ClusterProfile]) -> int:
    """An observation row for each ended attempt that has none yet; how many were written."""
    query = (
        select(Attempt, Job)
        .join(Job, col(Job.id) == Attempt.job_id)
        .outerjoin(AttemptObservation, col(AttemptObservation.attempt_id) == Attempt.id)
        .where(col(Attempt.status).in_(_ENDED), col(AttemptObservation.attempt_id).is_(None))
        .limit(BATCH)
    )
    rows = session.exec(query).all()
    for attempt, job in rows:
        session.add(observation_row(session, attempt, job, profiles.get(job.cluster)))
    session.flush()
    return len(rows)


def observation_row(
    session: Session, attempt: Attempt, job: Job, profile: ClusterProfile | None
) -> AttemptObservation:
    row = AttemptObservation(
        attempt_id=attempt.id, job_id=job.id, cluster=job.cluster,
        accelerator=profile.accelerator if profile else "", spec=job.spec, plan=attempt.plan,
        predicted_step_seconds=attempt.plan.get("step_seconds"),
        predicted_peak_bytes=(attempt.plan.get("per_gpu_bytes") or {}).get("total"),
    )  # fmt: skip
    try:
        spec, _plan = JobSpec.model_validate(job.spec), Candidate.model_validate(attempt.plan)
    except ValidationError:  # stored before today's schema: nothing to rebuild the plan from
        row.skipped = "its spec or plan no longer reads as today's"
        return row
    if profile is None:
        row.skipped = f"cluster {job.cluster!r} is no longer configured"
        return row
    points = _points(session, attempt.id)
    measured = measure(AttemptStatus(attempt.status), spec, [p[0] for p in points])
    _fill(row, measured, points, runs_on_cpu(profile))
    if measured.step_seconds is not None:
        row.neighbours = _neighbours(session, attempt, job, profile)
    return row


def _points(session: Session, attempt_id: str) -> list[tuple[float | None, int | None, Any]]:
    query = (
        select(MetricPoint.tokens_per_s, MetricPoint.memory_peak_bytes, MetricPoint.extra)
        .where(MetricPoint.attempt_id == attempt_id)
        .order_by(col(MetricPoint.step))
    )
    return list(session.exec(query).all())


def _fill(
    row: AttemptObservation,
    measured: Measured,
    points: list[tuple[float | None, int | None, Any]],
    on_cpu: bool,
) -> None:
    row.step_seconds, row.steady_steps, row.skipped = (
        measured.step_seconds, measured.steady_steps, measured.skipped
    )  # fmt: skip
    reserved = [int(e[RESERVED_PEAK_KEY]) for _t, _p, e in points if e and e.get(RESERVED_PEAK_KEY)]
    peaks = [p for _t, p, _e in points if p is not None]
    use_reserved = bool(reserved) and not on_cpu
    row.peak_kind = peak_kind(on_cpu, use_reserved)
    row.peak_bytes = max(reserved) if use_reserved else max(peaks, default=None)


def _neighbours(session: Session, attempt: Attempt, job: Job, profile: ClusterProfile) -> int:
    """On CPU ranks of the local backend every attempt running alongside shares the host; on
    GPUs zeropilot gives each attempt its own, so another process's memory at start tells."""
    if not runs_on_cpu(profile):
        devices = attempt.runtime_evidence.get("devices", {}).values()
        others = max((d.get("numbers", {}).get("other_processes_bytes", 0) for d in devices),
                     default=0)  # fmt: skip
        return 1 if others >= CONTEXT_ALLOWANCE else 0
    if profile.kind != BackendKind.LOCAL or attempt.finished_at is None:
        return 0
    began = as_utc(attempt.started_at or attempt.created_at)
    overlapping = (
        select(func.count())
        .select_from(Attempt)
        .join(Job, col(Job.id) == Attempt.job_id)
        .where(
            Job.cluster == job.cluster,
            Attempt.id != attempt.id,
            col(Attempt.started_at) < attempt.finished_at,
            or_(col(Attempt.finished_at).is_(None), col(Attempt.finished_at) > began),
        )
    )
    return int(session.exec(overlapping).one())
