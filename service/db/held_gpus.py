"""Counters of the GPUs held per team and cluster (the ``HeldGpus`` rows).

Only ``service.db.transitions`` adds to them, in the transaction that moves a job into or out
of a holding status, so they always agree with the jobs' statuses. Reading them costs a few rows
whatever the number of jobs.
"""

from __future__ import annotations

from sqlalchemy import case, or_
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, func, select

from service.core.admission import Held
from service.db.models import HeldGpus, Team


def add_held(session: Session, team_id: int, cluster: str, gpus: int) -> None:
    """Add ``gpus`` (negative: release them) to the team's count on the cluster."""
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    insert = dialect.insert(HeldGpus).values(team_id=team_id, cluster=cluster, gpus=gpus)
    session.connection().execute(  # a plain statement: no ORM objects to synchronize
        insert.on_conflict_do_update(
            index_elements=["team_id", "cluster"],
            set_={"gpus": col(HeldGpus.gpus) + insert.excluded.gpus},
        )
    )


def held_by(session: Session, team: Team, cluster: str) -> Held:
    """What the team holds (on every cluster) and what is held on the cluster (by every team)."""
    mine = or_(col(HeldGpus.team_id) == team.id, col(HeldGpus.cluster) == cluster)
    by_team = func.sum(case((col(HeldGpus.team_id) == team.id, HeldGpus.gpus), else_=0))
    by_cluster = func.sum(case((col(HeldGpus.cluster) == cluster, HeldGpus.gpus), else_=0))
    team_gpus, cluster_gpus = session.exec(select(by_team, by_cluster).where(mine)).one()
    return Held(by_team={team.name: team_gpus or 0}, by_cluster={cluster: cluster_gpus or 0})


def held_everywhere(session: Session, team_names: dict[int, str]) -> Held:
    """GPUs held per team and per cluster, every team and cluster."""
    usage = Held()
    for row in session.exec(select(HeldGpus)).all():
        team = team_names[row.team_id]
        usage.by_team[team] = usage.by_team.get(team, 0) + row.gpus
        usage.by_cluster[row.cluster] = usage.by_cluster.get(row.cluster, 0) + row.gpus
    return usage
