"""Counters of the GPUs held per team and cluster (the ``HeldGpus`` rows).

Only ``service.db.transitions`` adds to them, in the transaction that moves a job into or out
of a holding status, so they always agree with the jobs' statuses. Reading them costs a few rows
whatever the number of jobs.
"""

from __future__ import annotations

from functools import lru_cache

from sqlalchemy import Insert
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from service.core.admission import Held
from service.db import plain
from service.db.models import HeldGpus


def add_held(session: Session, team_id: int, cluster: str, gpus: int) -> None:
    """Add ``gpus`` (negative: release them) to the team's count on the cluster."""
    values = {"team_id": team_id, "cluster": cluster, "gpus": gpus}
    statement = _upsert(session.get_bind().dialect.name)
    plain.execute(session, statement, [values], keys=list(values))  # no ORM objects to sync


@lru_cache(maxsize=2)
def _upsert(dialect_name: str) -> Insert:
    """Built once per dialect: building it (its ``excluded`` columns) cost more than running it."""
    dialect = postgresql if dialect_name == "postgresql" else sqlite
    insert = dialect.insert(HeldGpus)
    upsert: Insert = insert.on_conflict_do_update(
        index_elements=["team_id", "cluster"],
        set_={"gpus": col(HeldGpus.gpus) + insert.excluded.gpus},
    )
    return upsert


def held_everywhere(session: Session, team_names: dict[int, str]) -> Held:
    """GPUs held per team and per cluster, every team and cluster."""
    usage = Held()
    for row in session.exec(select(HeldGpus)).all():
        team = team_names[row.team_id]
        usage.by_team[team] = usage.by_team.get(team, 0) + row.gpus
        usage.by_cluster[row.cluster] = usage.by_cluster.get(row.cluster, 0) + row.gpus
    return usage
