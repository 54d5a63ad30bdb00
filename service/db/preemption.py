"""Preemption in the database: the snapshot ``service.core.preemption`` decides on, its marks.

Runs in the workers' periodic pass, after admission and under the same admission turn, only
when jobs still wait. One preemption at a time: while a victim saves and stops, nothing else is
chosen, so the GPUs it frees go to the job it stops for, not to a second round of victims. The
worker stops the victims (the graceful stop of ``docs/launch.md``); when a victim's attempt
ends, ``workers.disruption.requeue`` puts its job back in line at its original place,
resuming from the checkpoint it saved.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func
from sqlalchemy import select as sql_select
from sqlmodel import Session, col, select

from service.core.admission import Waiting
from service.core.preemption import Policy, Preemption, Running, choose_victims
from service.core.states import JobStatus
from service.db.admission import WAITING_PREFIX, as_waiting, held, limits_of, waiting_jobs
from service.db.models import Attempt, Checkpoint, Job, Team, as_utc
from service.db.transitions import note_job

STOPPING = (JobStatus.LAUNCHING, JobStatus.RUNNING)
LINE = 5  # waiting jobs looked at per pass, first in line first


@dataclass(frozen=True)
class Stop:
    job_id: str
    attempt_id: str
    reason: str


def choose_stops(
    session: Session,
    profiles: dict[str, Any],
    policy: Policy,
    borrowing: bool,
    now: datetime,
) -> list[Stop]:
    """Victims for the first waiting job that admission left waiting and that they let start;
    marked as stopping for it, with an event on both jobs. None while a victim still stops."""
    if _stopping(session):
        return []
    teams = session.exec(select(Team)).all()
    names = {team.id: team.name for team in teams if team.id is not None}
    pending = sorted(
        # the back-off counts as in admission: a job that may not borrow yet stops no one
        (as_waiting(job, names, policy.min_runtime_s) for job in waiting_jobs(session)),
        key=lambda w: (-w.priority, w.submitted_at, w.job_id),
    )
    running = running_jobs(session, names)
    limits = limits_of(session, teams, profiles, borrowing)
    usage = held(session, names)
    for waiting in pending[:LINE]:
        if chosen := choose_victims(waiting, running, usage, limits, now, policy):
            return _mark(session, waiting, chosen)
    return []


def running_jobs(session: Session, names: dict[int, str]) -> list[Running]:
    """Admitted jobs running now, with their attempt's start and last complete checkpoint
    (the columns the policy reads, never a spec or plan)."""
    last = (
        sql_select(col(Checkpoint.job_id), func.max(col(Checkpoint.id)).label("id"))
        .group_by(col(Checkpoint.job_id))
        .subquery()
    )
    columns = (Job.id, Job.team_id, Job.cluster, Job.gpus, Job.priority, Job.borrowing)
    extra = (Attempt.started_at, Checkpoint.created_at, Checkpoint.step)
    query = (
        sql_select(*(col(c) for c in (*columns, *extra)))
        .join(Attempt, (col(Attempt.job_id) == Job.id) & (Attempt.number == Job.current_attempt))
        .outerjoin(last, last.c.job_id == Job.id)
        .outerjoin(Checkpoint, col(Checkpoint.id) == last.c.id)
        .where(col(Job.status) == JobStatus.RUNNING, col(Attempt.started_at).is_not(None))
    )
    return [
        Running(
            job_id, names[team_id], cluster, gpus, priority, borrowing, as_utc(started),
            as_utc(saved_at) if saved_at else None, step,
        )
        for job_id, team_id, cluster, gpus, priority, borrowing, started, saved_at, step
        in session.execute(query).all()
    ]  # fmt: skip


def _stopping(session: Session) -> bool:
    query = select(Job.id).where(col(Job.stopping_for).is_not(None), col(Job.status).in_(STOPPING))
    return session.exec(query.limit(1)).first() is not None


def _mark(session: Session, waiting: Waiting, chosen: Preemption) -> list[Stop]:
    stops = []
    for victim_id in chosen.victims:
        victim = session.get(Job, victim_id)
        assert victim is not None
        victim.stopping_for = waiting.job_id
        session.add(victim)
        reason = chosen.reasons[victim_id]
        note_job(session, victim, reason)
        attempt = session.exec(
            select(Attempt).where(
                Attempt.job_id == victim.id, Attempt.number == victim.current_attempt
            )
        ).one()
        stops.append(Stop(victim.id, attempt.id, reason))
    job = session.get(Job, waiting.job_id)
    assert job is not None
    why = f"stopping job {', '.join(chosen.victims)} to free its GPUs for this one"
    job.message = WAITING_PREFIX + why
    session.add(job)
    note_job(session, job, why)
    return stops
