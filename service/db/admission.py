"""Admission pass: move the PENDING jobs that fit to QUEUED (``service.core.admission`` decides).

The API runs a pass right after storing a job, and the workers' periodic reconcile runs one
every few seconds, so a job waiting for its team's quota starts once GPUs are released. Every
pass first updates the single ``AdmissionTurn`` row: on PostgreSQL that row lock, on SQLite the
database's one writer, lets only one pass decide at a time, so two passes never both admit
into the last free GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import update
from sqlmodel import Session, col, select

from service.core.admission import Held, Limits, Waiting, admit, never_fits
from service.core.clusters import ClusterProfile
from service.core.states import JobStatus
from service.db.jobs import current_attempt
from service.db.models import AdmissionTurn, Job, Team
from service.db.transitions import move_job

# Statuses in which a job holds its GPUs (from admission until it ends).
HOLDING = (JobStatus.QUEUED, JobStatus.LAUNCHING, JobStatus.RUNNING, JobStatus.ESCALATING)
WAITING_PREFIX = "waiting: "


def job_gpus(job: Job) -> int:
    resources = job.spec["resources"]
    return int(resources["nodes"]) * int(resources["gpus_per_node"])


def limits_of(teams: Sequence[Team], profiles: dict[str, ClusterProfile]) -> Limits:
    return Limits(
        team_quota={team.name: team.gpu_quota for team in teams},
        team_share={team.name: team.gpu_share for team in teams},
        cluster_cap={name: profile.max_gpus for name, profile in profiles.items()},
    )


def held(session: Session, team_names: dict[int, str]) -> Held:
    """GPUs held per team and per cluster by admitted, unfinished jobs."""
    usage = Held()
    for job in session.exec(select(Job).where(col(Job.status).in_(HOLDING))).all():
        team = team_names[job.team_id]
        usage.by_team[team] = usage.by_team.get(team, 0) + job_gpus(job)
        usage.by_cluster[job.cluster] = usage.by_cluster.get(job.cluster, 0) + job_gpus(job)
    return usage


def admit_pending(session: Session, profiles: dict[str, ClusterProfile]) -> list[str]:
    """Admit the PENDING jobs that fit; return the ids of the attempts to launch (send them
    after the commit). Jobs left waiting get the reason as their message."""
    _take_turn(session)  # first, so that on SQLite the pass starts as the one writer
    pending = session.exec(select(Job).where(Job.status == JobStatus.PENDING)).all()
    if not pending:
        return []
    teams = session.exec(select(Team)).all()
    names = {team.id: team.name for team in teams if team.id is not None}
    waiting = [
        Waiting(
            job.id, names[job.team_id], job.cluster, job_gpus(job), job.priority, job.created_at
        )
        for job in pending
    ]
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
