"""When a ``cluster: auto`` job would start on a cluster where it cannot start now: from the
limits it waits for (its team's quota, the cluster's cap), the GPUs already waiting ahead of it
there, and when the jobs holding those GPUs are predicted to end (each one's remaining steps at
its predicted step time). A few aggregate statements per cluster, whatever the backlog."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func
from sqlalchemy import select as sql_select
from sqlmodel import Session, col

from service.core.admission import HOLDING
from service.core.placement import start_in_s
from service.core.states import JobStatus
from service.db.admission import submit_view
from service.db.models import Job, MetricPoint
from service.db.users import Caller


def expected_start_s(
    session: Session, caller: Caller, cluster: str, gpus: int, cap: int | None
) -> float | None:
    """Seconds until a job of ``gpus`` GPUs of the caller's team would start on ``cluster``:
    the later of the two limits' answers; None when a limit needs a job whose end is unknown."""
    held, _team_waits, _cluster_waits = submit_view(session, caller, cluster)
    starts = []
    if caller.gpu_quota is not None:
        team = col(Job.team_id) == caller.team_id
        free = caller.gpu_quota - held.by_team[caller.team_name]
        need = gpus + _waiting_gpus(session, team)
        starts.append(start_in_s(need, free, _ends(session, team)))
    if cap is not None:
        on_cluster = col(Job.cluster) == cluster
        free = cap - held.by_cluster[cluster]
        need = gpus + _waiting_gpus(session, on_cluster)
        starts.append(start_in_s(need, free, _ends(session, on_cluster)))
    if any(start is None for start in starts):
        return None
    return max((s for s in starts if s is not None), default=0.0)


def _waiting_gpus(session: Session, where: Any) -> int:
    """GPUs of the jobs already waiting under the same limit: a new job waits behind them."""
    query = sql_select(func.coalesce(func.sum(col(Job.gpus)), 0)).where(
        col(Job.status) == JobStatus.PENDING, where
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
