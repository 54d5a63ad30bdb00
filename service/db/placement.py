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

from sqlalchemy import and_, case, func, or_, update
from sqlalchemy import select as sql_select
from sqlmodel import Session, col, select

from service.core.admission import HOLDING, Cap
from service.core.states import AttemptStatus, JobStatus
from service.db.admission import WAITING_PREFIX, submit_view
from service.db.models import Attempt, Job, JobEvent, MetricPoint, utcnow
from service.db.users import Caller


def expected_start_s(
    session: Session,
    caller: Caller,
    cluster: str,
    gpus: int,
    cap: Cap,
    excluding: str | None = None,
    moving_from: str | None = None,
) -> float | None:
    """Seconds until a job of ``gpus`` GPUs of the caller's team would start on ``cluster``:
    the later of the two limits' answers; None when a limit needs a job whose end is unknown.
    ``excluding``: the job asking for itself, not counted among those ahead of it or holding
    GPUs; ``moving_from``: the cluster where it still holds its GPUs, given up as it moves."""
    held, _team_waits, _cluster_waits = submit_view(session, caller, cluster)
    own = gpus if moving_from is not None else 0
    starts = []
    if caller.gpu_quota is not None:
        team = _others(col(Job.team_id) == caller.team_id, excluding)
        free = caller.gpu_quota - held.by_team[caller.team_name] + own
        need = gpus + _waiting_gpus(session, team)
        starts.append(start_in_s(session, team, need - free))
    if cap.gpus is not None:
        on_cluster = _others(col(Job.cluster) == cluster, excluding)
        free = cap.gpus - held.by_cluster[cluster] + (own if cluster == moving_from else 0)
        need = gpus + _waiting_gpus(session, on_cluster)
        starts.append(start_in_s(session, on_cluster, need - free))
    if any(start is None for start in starts):
        return None
    return max((s for s in starts if s is not None), default=0.0)


def _others(where: Any, excluding: str | None) -> Any:
    return where if excluding is None else and_(where, col(Job.id) != excluding)


def _waiting_gpus(session: Session, where: Any) -> int:
    """GPUs of the jobs already waiting under the same limit: a new job waits behind them."""
    query = sql_select(func.coalesce(func.sum(col(Job.gpus)), 0)).where(
        col(Job.status) == JobStatus.PENDING, where
    )
    return int(session.execute(query).scalar_one())


def start_in_s(session: Session, where: Any, short: int) -> float | None:
    """Seconds until ``short`` more GPUs than are free now free up under a limit: the
    predicted end of the job holding GPUs there whose GPUs make it enough, the jobs taken in
    order of their ends (each one's remaining steps at its step time). None when that needs a
    job whose end is not known, or more GPUs than the limit's jobs hold. One row, however many
    jobs hold GPUs there: the running sum is the database's."""
    if short <= 0:
        return 0.0
    last_step = (
        sql_select(func.max(MetricPoint.step))
        .where(col(MetricPoint.job_id) == Job.id)
        .correlate(Job)
        .scalar_subquery()
    )
    left = col(Job.steps) - func.coalesce(last_step, 0)
    remaining = case(
        (or_(col(Job.steps).is_(None), col(Job.step_s).is_(None)), None),  # no length given
        (left > 0, left * col(Job.step_s)),
        else_=0.0,
    )
    holding = (
        sql_select(col(Job.gpus).label("gpus"), remaining.label("remaining"))
        .where(col(Job.status).in_(HOLDING), where)
        .subquery()
    )
    ends_first = (holding.c.remaining.is_(None), holding.c.remaining, holding.c.gpus)
    released = func.sum(holding.c.gpus).over(order_by=ends_first, rows=(None, 0))
    ordered = sql_select(holding.c.remaining, released.label("released")).subquery()
    enough = (
        sql_select(ordered.c.remaining)
        .where(ordered.c.released >= short)
        .order_by(ordered.c.released)
        .limit(1)
    )
    row = session.execute(enough).first()
    return None if row is None or row[0] is None else float(row[0])


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
