"""When a ``cluster: auto`` job would start on a cluster where it cannot start now: from the
limits it waits for (its team's quota, the cluster's cap), the GPUs already waiting ahead of it
there, and when the jobs holding those GPUs are predicted to end (each one's remaining steps at
its predicted step time). A few aggregate statements per cluster, whatever the backlog.

Also the waiting ``cluster: auto`` jobs a reconcile pass may re-place (a bounded few), and the
move itself: a compare-and-set on the job still waiting where it was, never a status change."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, update
from sqlalchemy import select as sql_select
from sqlmodel import Session, col, select

from service.core.admission import HOLDING
from service.core.placement import start_in_s
from service.core.states import AttemptStatus, JobStatus
from service.db.admission import WAITING_PREFIX, submit_view
from service.db.models import Attempt, Job, JobEvent, MetricPoint, utcnow
from service.db.users import Caller


def expected_start_s(
    session: Session,
    caller: Caller,
    cluster: str,
    gpus: int,
    cap: int | None,
    excluding: str | None = None,
) -> float | None:
    """Seconds until a job of ``gpus`` GPUs of the caller's team would start on ``cluster``:
    the later of the two limits' answers; None when a limit needs a job whose end is unknown.
    ``excluding``: a waiting job asking for itself, not counted among those ahead of it."""
    held, _team_waits, _cluster_waits = submit_view(session, caller, cluster)
    starts = []
    if caller.gpu_quota is not None:
        team = col(Job.team_id) == caller.team_id
        free = caller.gpu_quota - held.by_team[caller.team_name]
        need = gpus + _waiting_gpus(session, team, excluding)
        starts.append(start_in_s(need, free, _ends(session, team)))
    if cap is not None:
        on_cluster = col(Job.cluster) == cluster
        free = cap - held.by_cluster[cluster]
        need = gpus + _waiting_gpus(session, on_cluster, excluding)
        starts.append(start_in_s(need, free, _ends(session, on_cluster)))
    if any(start is None for start in starts):
        return None
    return max((s for s in starts if s is not None), default=0.0)


def _waiting_gpus(session: Session, where: Any, excluding: str | None = None) -> int:
    """GPUs of the jobs already waiting under the same limit: a new job waits behind them."""
    query = sql_select(func.coalesce(func.sum(col(Job.gpus)), 0)).where(
        col(Job.status) == JobStatus.PENDING, where, col(Job.id) != (excluding or "")
    )
    return int(session.execute(query).scalar_one())


def _ends(session: Session, where: Any) -> list[tuple[int, float | None]]:
    """GPUs and predicted seconds to the end of each job holding GPUs under that limit."""
    last_step = (
        sql_select(func.max(MetricPoint.step))
        .where(col(MetricPoint.job_id) == Job.id)
        .correlate(Job)
        .scalar_subquery()
    )
    query = sql_select(col(Job.gpus), col(Job.steps), col(Job.step_s), last_step).where(
        col(Job.status).in_(HOLDING), where
    )
    return [(row[0], _remaining_s(*row[1:])) for row in session.execute(query).all()]


def _remaining_s(steps: int | None, step_s: float | None, done: int | None) -> float | None:
    if steps is None or step_s is None:
        return None  # no length given: when it ends is anyone's guess
    return float(max(steps - (done or 0), 0) * step_s)


def waiting_auto_jobs(session: Session, placed_before: datetime, limit: int) -> Sequence[Job]:
    """The first ``limit`` waiting ``cluster: auto`` jobs in admission order (priority, then
    submit time) placed before ``placed_before``: a pass's work, whatever the backlog."""
    query = (
        select(Job)
        .where(
            col(Job.status) == JobStatus.PENDING,
            col(Job.placed_at).is_not(None),
            col(Job.placed_at) <= placed_before,
        )
        .order_by(col(Job.priority).desc(), col(Job.created_at), col(Job.id))
        .limit(limit)
    )
    return session.exec(query).all()


def move_waiting_job(
    session: Session,
    job: Job,
    attempt: Attempt,
    *,
    to: str,
    backend: str,
    plan: dict[str, Any],
    step_s: float | None,
    advice_reason: str,
    reason: str,
) -> bool:
    """Put a waiting job and its attempt, not yet launched, on cluster ``to`` with ``plan``,
    if the job still waits where it was; an event says why. PENDING holds no GPUs, so no
    counter changes."""
    now = utcnow()
    moved = session.execute(
        update(Job)
        .where(
            col(Job.id) == job.id,
            col(Job.status) == JobStatus.PENDING,
            col(Job.cluster) == job.cluster,
        )
        .values(
            cluster=to,
            plan=plan,
            advice_reason=advice_reason,
            placed_at=now,
            updated_at=now,
            step_s=step_s,
            message=f"{WAITING_PREFIX}re-placed on {to}; admission starts it there",
        )
        .execution_options(synchronize_session=False)
    )
    if moved.rowcount != 1:  # type: ignore[attr-defined]
        return False
    session.expire(job)  # what admission reads of it next comes from the row as written
    session.execute(
        update(Attempt)
        .where(col(Attempt.id) == attempt.id, col(Attempt.status) == AttemptStatus.QUEUED)
        .values(plan=plan, backend=backend, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    session.add(JobEvent(
        job_id=job.id, subject="job", attempt_number=attempt.number,
        from_status=JobStatus.PENDING, to_status=JobStatus.PENDING, reason=reason,
    ))  # fmt: skip
    return True
