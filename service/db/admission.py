"""Admission: move PENDING jobs that fit to QUEUED (``service.core.admission`` decides).

A submit admits only its own job, and only when no other job waits in its team or on its
cluster: then no waiting job's turn depends on it, and the decision needs one statement over
indexes and the ``HeldGpus`` counters, whatever the number of jobs (none at all when neither a
team quota nor a cluster cap applies). Otherwise the job stays PENDING for
the full pass, which the workers' periodic reconcile runs every few seconds (and a quota change
runs at once) over every waiting job, so a job waiting for GPUs starts once they are released.
Both first update the single ``AdmissionTurn`` row: on PostgreSQL that row lock, on SQLite the
database's one writer, lets one decision happen at a time, so two never both admit into the
last free GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, and_, exists, func, update
from sqlalchemy import select as sql_select
from sqlmodel import Session, col, select

from service.core.admission import Cap, Decision, Held, Limits, Waiting, admit, never_fits
from service.core.backfill import Backfill, Margin, backfill
from service.core.clusters import ClusterProfile
from service.core.forecast import Holding, Length, forecast, with_started
from service.core.preemption import borrow_backoff
from service.core.states import JobStatus
from service.db.cluster_bounds import caps_of
from service.db.forecast import holding_jobs, length_of, start_error_s, write_predictions
from service.db.held_gpus import held_everywhere
from service.db.jobs import current_attempt
from service.db.models import AdmissionTurn, HeldGpus, Job, Team, as_utc, utcnow
from service.db.transitions import move_job
from service.db.users import Caller

WAITING_PREFIX = "waiting: "


def limits_of(
    session: Session,
    teams: Sequence[Team],
    profiles: dict[str, ClusterProfile],
    borrowing: bool = False,
) -> Limits:
    return Limits.of_caps(
        caps_of(session, profiles),
        team_quota={team.name: team.gpu_quota for team in teams},
        team_share={team.name: team.gpu_share for team in teams},
        borrowing=borrowing,
        team_borrow_limit={team.name: team.borrow_limit for team in teams},
    )


def held(session: Session, team_names: dict[int, str]) -> Held:
    """GPUs held per team and per cluster by admitted, unfinished jobs."""
    return held_everywhere(session, team_names)


def decide_submitted(
    session: Session,
    caller: Caller,
    cluster: str,
    gpus: int,
    priority: int,
    cap: Cap,
    borrowing: bool = False,
) -> str | None:
    """Whether a job about to be stored may be admitted at once: None if so (store it QUEUED
    and launch it after the commit), else why it waits (store it PENDING with that message).

    Without a team quota or a cluster cap nothing can hold it back, and no statement is needed.
    Otherwise the decision takes the admission turn (held until the commit, so the job is in
    the table before the next decision) and reads the counters in one statement."""
    if caller.gpu_quota is None and cap.gpus is None:
        return None
    _take_turn(session)
    return would_wait(session, caller, cluster, gpus, priority, cap, borrowing)


def would_wait(
    session: Session,
    caller: Caller,
    cluster: str,
    gpus: int,
    priority: int,
    cap: Cap,
    borrowing: bool = False,
    moving_from: str | None = None,
    excluding: str | None = None,
) -> str | None:
    """Why a job of the caller's would wait on ``cluster`` now, or None: reads only (placement
    asks it of every cluster; ``decide_submitted`` asks it under the admission turn). A job
    ``moving_from`` another cluster still holds its GPUs there, which it gives up as it moves;
    ``excluding``: a waiting job asking for itself, not among the jobs that wait."""
    team = caller.team_name
    if caller.gpu_quota is None and cap.gpus is None:
        return None
    held, team_waits, cluster_waits = submit_view(session, caller, cluster, excluding)
    if moving_from is not None:  # its own GPUs are no limit to it
        held.by_team[team] -= gpus
        if cluster == moving_from:
            held.by_cluster[cluster] -= gpus
    limits = Limits.of_caps({cluster: cap}, team_quota={team: caller.gpu_quota})
    new = Waiting("new", team, cluster, gpus, priority, utcnow())
    if why := admit([new], held, limits).waiting.get("new"):
        return why
    # Another job waits where it shares a limit with this one: the full pass orders them.
    if caller.gpu_quota is not None and team_waits:
        return f"other jobs of team {team} wait too; the next admission pass orders them"
    if cap.gpus is not None and cluster_waits:
        return f"other jobs wait for cluster {cluster}; the next admission pass orders them"
    if borrowing and cap.gpus is None and caller.gpu_quota is not None:
        return _pool_full(session, gpus, held_already=gpus if moving_from is not None else 0)
    return None


def _pool_full(session: Session, gpus: int, held_already: int = 0) -> str | None:
    """With borrowing, a job within its quota may still find the quota pool lent out: then the
    full pass decides (and preemption reclaims the loan). ``held_already``: GPUs of the pool
    the job itself holds (a re-placed job, before it moves)."""
    quota = col(Team.gpu_quota)
    capacity = select(func.coalesce(func.sum(quota), 0)).where(quota.is_not(None))
    in_use = (
        select(func.coalesce(func.sum(HeldGpus.gpus), 0))
        .join(Team, col(Team.id) == HeldGpus.team_id)
        .where(quota.is_not(None))
    )
    row = session.execute(select(capacity.scalar_subquery(), in_use.scalar_subquery())).one()
    total, used = int(row[0]), int(row[1]) - held_already
    if used + gpus <= total:
        return None
    return (
        f"{used} of the quota pool's {total} GPUs are in use, some lent to other teams; the next"
        " admission pass reclaims them"
    )


def submit_view(
    session: Session, caller: Caller, cluster: str, excluding: str | None = None
) -> tuple[Held, bool, bool]:
    """GPUs held by the team and on the cluster, and whether jobs (but ``excluding``) wait in
    either."""
    held = select(func.coalesce(func.sum(HeldGpus.gpus), 0))
    by_team = held.where(col(HeldGpus.team_id) == caller.team_id).scalar_subquery()
    by_cluster = held.where(col(HeldGpus.cluster) == cluster).scalar_subquery()
    pending = col(Job.status) == JobStatus.PENDING
    if excluding is not None:
        pending = and_(pending, col(Job.id) != excluding)
    team_waits = exists().where(pending, col(Job.team_id) == caller.team_id)
    cluster_waits = exists().where(pending, col(Job.cluster) == cluster)
    row = session.execute(select(by_team, by_cluster, team_waits, cluster_waits)).one()
    usage = Held(by_team={caller.team_name: int(row[0])}, by_cluster={cluster: int(row[1])})
    return usage, bool(row[2]), bool(row[3])


# What ordering and counting waiting jobs needs: never the spec or plan (up to a megabyte each).
WAITING_COLUMNS = (
    col(Job.id), col(Job.name), col(Job.team_id), col(Job.cluster), col(Job.gpus),
    col(Job.priority), col(Job.created_at), col(Job.message), col(Job.preempted_by),
    col(Job.requeued_at), col(Job.steps), col(Job.step_s), col(Job.time_limit_s),
    col(Job.predicted_start_at), col(Job.predicted_end_at), col(Job.prediction_basis),
    col(Job.first_predicted_start_at), col(Job.first_predicted_at), col(Job.predicted_at),
)  # fmt: skip


def waiting_jobs(session: Session, team_id: int | None = None) -> Sequence[Row[Any]]:
    """The PENDING jobs (of one team, or every team's), as rows of ``WAITING_COLUMNS``."""
    query = sql_select(*WAITING_COLUMNS).where(col(Job.status) == JobStatus.PENDING)
    if team_id is not None:
        query = query.where(col(Job.team_id) == team_id)
    return session.execute(query).all()


def as_waiting(job: Row[Any], team_names: dict[int, str], backoff_s: float = 0.0) -> Waiting:
    preempted_by = frozenset(job.preempted_by or ())
    requeued_at = as_utc(job.requeued_at) if job.requeued_at else None
    return Waiting(
        job.id, team_names[job.team_id], job.cluster, job.gpus, job.priority, job.created_at,
        preempted_by, borrow_backoff(len(preempted_by), requeued_at, utcnow(), backoff_s),
    )  # fmt: skip


def admit_pending(
    session: Session,
    profiles: dict[str, ClusterProfile],
    borrowing: bool = False,
    backoff_s: float = 0.0,
    backfill_margin: Margin | None = None,
) -> list[str]:
    """Admit the PENDING jobs that fit (with ``backfill_margin``, also those that may pass a
    blocked job: ``service.core.backfill``); return the ids of the attempts to launch (send
    them after the commit). Jobs left waiting get the reason as their message and their
    predicted start and end. ``backoff_s``: how long a preempted job waits before it borrows
    again (``borrow_backoff``)."""
    _take_turn(session)  # first, so that on SQLite the pass starts as the one writer
    pending = waiting_jobs(session)
    if not pending:
        return []
    teams = session.exec(select(Team)).all()
    names = {team.id: team.name for team in teams if team.id is not None}
    waiting = [as_waiting(job, names, backoff_s) for job in pending]
    limits = limits_of(session, teams, profiles, borrowing)
    snapshot = _Snapshot(waiting, held(session, names), holding_jobs(session, names), utcnow(),
                         {job.id: length_of(job) for job in pending})  # fmt: skip
    decision = admit(waiting, snapshot.held, limits)
    passed = Backfill([], {})
    if backfill_margin is not None:
        passed = backfill(waiting, decision, snapshot.lengths, snapshot.holding, snapshot.held,
                          limits, snapshot.now, backfill_margin)  # fmt: skip
    launches = _admit_all(session, decision, passed, snapshot.now)
    _write_waiting(session, pending, decision, passed, snapshot, limits)
    return launches


@dataclass(frozen=True)
class _Snapshot:
    """What one pass reads: the waiting jobs, the GPUs held and by whom, their lengths."""

    waiting: list[Waiting]
    held: Held
    holding: list[Holding]
    now: datetime
    lengths: dict[str, Length]


def _admit_all(session: Session, decision: Decision, passed: Backfill, now: datetime) -> list[str]:
    """Move the admitted jobs, then the backfilled ones, to QUEUED; the attempts to launch."""
    starting = [(job_id, job_id in decision.borrowing, "") for job_id in decision.admitted]
    starting += [(job_id, job_id in passed.borrowing, passed.reasons[job_id])
                 for job_id in passed.admitted]  # fmt: skip
    return [
        attempt_id
        for job_id, borrows, why in starting
        if (attempt_id := _admit(session, job_id, now, borrows, why)) is not None
    ]


def _write_waiting(
    session: Session,
    pending: Sequence[Row[Any]],
    decision: Decision,
    passed: Backfill,
    snapshot: _Snapshot,
    limits: Limits,
) -> None:
    """The jobs still waiting: why (where it changed), and when they are predicted to start."""
    started = {*decision.admitted, *passed.admitted}
    now, lengths = snapshot.now, snapshot.lengths
    starting = [job for job in snapshot.waiting if job.job_id in started]
    held_after, holders = with_started(starting, lengths, snapshot.held, now)
    still = [job for job in snapshot.waiting if job.job_id not in started]
    reasons = decision.waiting
    if passed.admitted:  # the reasons count the GPUs held before the backfilled jobs took theirs
        reasons = {**reasons, **admit(still, held_after, limits).waiting}
    _write_reasons(session, pending, {job.job_id: reasons[job.job_id] for job in still})
    order = [job_id for job_id in decision.considered if job_id not in started]
    predictions = forecast(still, order, lengths, [*snapshot.holding, *holders], held_after,
                           limits, now)  # fmt: skip
    write_predictions(session, pending, predictions, now)


def _write_reasons(session: Session, pending: Sequence[Row[Any]], reasons: dict[str, str]) -> None:
    messages = {job.id: job.message for job in pending}
    changed = [  # write only what changed
        {"id": job_id, "message": WAITING_PREFIX + why}
        for job_id, why in reasons.items()
        if messages[job_id] != WAITING_PREFIX + why
    ]
    if changed:
        session.execute(update(Job), changed)  # by primary key, one executemany


def _admit(
    session: Session, job_id: str, now: datetime, borrowing: bool = False, why: str = ""
) -> str | None:
    """Move one job to QUEUED, keeping its first predicted start's error; the id of the
    attempt to launch, or None if it moved on."""
    job = session.get(Job, job_id)  # whole, as move_job takes it: only the admitted few
    if job is None:
        return None
    reason = "admitted, borrowing idle GPUs past its team's quota" if borrowing else "admitted"
    reason = f"{reason}; {why}" if why else reason
    moved = move_job(
        session, job, JobStatus.PENDING, JobStatus.QUEUED, reason, message="",
        borrowing=borrowing, start_prediction_error_s=start_error_s(job, now),
    )  # fmt: skip
    if not moved:
        return None
    attempt = current_attempt(session, job)
    return attempt.id if attempt is not None else None


def any_waiting(session: Session) -> bool:
    """A cheap read, in its own transaction, that spares the periodic pass its write."""
    first = session.exec(select(Job.id).where(Job.status == JobStatus.PENDING).limit(1)).first()
    return first is not None


def refusal(
    caller: Caller | None, cluster: str, gpus: int, cap: Cap, borrowing: bool = False
) -> str | None:
    """Why a job of ``gpus`` GPUs could never be admitted in the caller's team, or None (with
    borrowing, a job larger than its team's quota may still run on lent GPUs). Without a
    caller (advice) only the cluster's cap bounds it."""
    team = caller.team_name if caller else ""
    quota = None if borrowing or caller is None else caller.gpu_quota
    limits = Limits.of_caps({cluster: cap}, team_quota={team: quota})
    return never_fits(gpus, team, cluster, limits)


def _take_turn(session: Session) -> None:
    turn = update(AdmissionTurn).where(col(AdmissionTurn.id) == 1)
    result = session.execute(turn.values(turns=AdmissionTurn.turns + 1))
    if result.rowcount == 0:  # type: ignore[attr-defined]  # a database made without migrations
        session.add(AdmissionTurn(id=1, turns=1))
        session.flush()
