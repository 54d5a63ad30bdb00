"""Admission: move PENDING jobs that fit to QUEUED (``service.core.admission`` decides).

A submit admits only its own job, and only when no other job waits in its team or on its
cluster: then no waiting job's turn depends on it, and the decision needs a few indexed reads
and the ``HeldGpus`` counters, whatever the number of jobs. Otherwise the job stays PENDING for
the full pass, which the workers' periodic reconcile runs every few seconds (and a quota change
runs at once) over every waiting job, so a job waiting for GPUs starts once they are released.
Both first update the single ``AdmissionTurn`` row: on PostgreSQL that row lock, on SQLite the
database's one writer, lets one decision happen at a time, so two never both admit into the
last free GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import update
from sqlmodel import Session, col, select
from sqlmodel.sql.expression import SelectOfScalar

from service.core.admission import Held, Limits, Waiting, admit, gpus_of, never_fits
from service.core.clusters import ClusterProfile
from service.core.states import JobStatus
from service.db.held_gpus import held_by, held_everywhere
from service.db.jobs import current_attempt
from service.db.models import AdmissionTurn, Job, Team
from service.db.transitions import move_job

WAITING_PREFIX = "waiting: "


def job_gpus(job: Job) -> int:
    return gpus_of(job.spec)


def limits_of(teams: Sequence[Team], profiles: dict[str, ClusterProfile]) -> Limits:
    return Limits(
        team_quota={team.name: team.gpu_quota for team in teams},
        team_share={team.name: team.gpu_share for team in teams},
        cluster_cap={name: profile.max_gpus for name, profile in profiles.items()},
    )


def held(session: Session, team_names: dict[int, str]) -> Held:
    """GPUs held per team and per cluster by admitted, unfinished jobs."""
    return held_everywhere(session, team_names)


def admit_submitted(session: Session, job: Job, team: Team, profile: ClusterProfile) -> bool:
    """Admit the job just stored when it fits and no other waiting job could go before it;
    otherwise leave it PENDING with the reason. True: admitted (launch it after the commit)."""
    _take_turn(session)
    cap = profile.max_gpus
    limits = Limits(team_quota={team.name: team.gpu_quota}, cluster_cap={job.cluster: cap})
    decision = admit([_waiting(job, team.name)], held_by(session, team, job.cluster), limits)
    why = decision.waiting.get(job.id) or _decided_by_the_pass(session, job, team, cap)
    if why is None:
        return move_job(session, job, JobStatus.PENDING, JobStatus.QUEUED, "admitted", message="")
    job.message = WAITING_PREFIX + why
    session.add(job)
    return False


def _decided_by_the_pass(session: Session, job: Job, team: Team, cap: int | None) -> str | None:
    """Why the full pass must decide: another job waits where it shares a limit with this one
    (its team's quota, its cluster's cap). Without limits, waiting jobs never compete."""
    others = select(Job.id).where(Job.status == JobStatus.PENDING, Job.id != job.id).limit(1)
    if team.gpu_quota is not None and _any(session, others.where(Job.team_id == job.team_id)):
        return f"other jobs of team {team.name} wait too; the next admission pass orders them"
    if cap is not None and _any(session, others.where(Job.cluster == job.cluster)):
        return f"other jobs wait for cluster {job.cluster}; the next admission pass orders them"
    return None


def _any(session: Session, query: SelectOfScalar[str]) -> bool:
    return session.exec(query).first() is not None


def _waiting(job: Job, team: str) -> Waiting:
    return Waiting(job.id, team, job.cluster, gpus_of(job.spec), job.priority, job.created_at)


def admit_pending(session: Session, profiles: dict[str, ClusterProfile]) -> list[str]:
    """Admit the PENDING jobs that fit; return the ids of the attempts to launch (send them
    after the commit). Jobs left waiting get the reason as their message."""
    _take_turn(session)  # first, so that on SQLite the pass starts as the one writer
    pending = session.exec(select(Job).where(Job.status == JobStatus.PENDING)).all()
    if not pending:
        return []
    teams = session.exec(select(Team)).all()
    names = {team.id: team.name for team in teams if team.id is not None}
    waiting = [_waiting(job, names[job.team_id]) for job in pending]
    decision = admit(waiting, held(session, names), limits_of(teams, profiles))
    by_id = {job.id: job for job in pending}
    launches = []
    for job_id in decision.admitted:
        job = by_id[job_id]
        if move_job(session, job, JobStatus.PENDING, JobStatus.QUEUED, "admitted", message=""):
            attempt = current_attempt(session, job)
            if attempt is not None:
                launches.append(attempt.id)
    for job_id, why in decision.waiting.items():
        job = by_id[job_id]
        if job.message != WAITING_PREFIX + why:  # write only what changed
            job.message = WAITING_PREFIX + why
            session.add(job)
    return launches


def any_waiting(session: Session) -> bool:
    """A cheap read, in its own transaction, that spares the periodic pass its write."""
    first = session.exec(select(Job.id).where(Job.status == JobStatus.PENDING).limit(1)).first()
    return first is not None


def refusal(team: Team, cluster: str, gpus: int, cap: int | None) -> str | None:
    """Why a job of ``gpus`` GPUs could never be admitted, or None."""
    limits = Limits(team_quota={team.name: team.gpu_quota}, cluster_cap={cluster: cap})
    return never_fits(gpus, team.name, cluster, limits)


def _take_turn(session: Session) -> None:
    turn = update(AdmissionTurn).where(col(AdmissionTurn.id) == 1)
    result = session.execute(turn.values(turns=AdmissionTurn.turns + 1))
    if result.rowcount == 0:  # type: ignore[attr-defined]  # a database made without migrations
        session.add(AdmissionTurn(id=1, turns=1))
        session.flush()
