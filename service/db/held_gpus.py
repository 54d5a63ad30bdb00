"""Counters of the GPUs held per team and cluster (the ``HeldGpus`` rows).

Only ``service.db.transitions`` decides what to add to them, in the transaction (or, for a job
admitted as it is stored, the statement: ``service.db.new_job``) that moves a job into or out of
a holding status, so they always agree with the jobs' statuses. Reading them costs a few rows
whatever the number of jobs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import Insert, bindparam
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from service.core.admission import Held
from service.db import plain
from service.db.models import HeldGpus


@dataclass(frozen=True)
class HeldChange:
    """``gpus`` more (negative: fewer) held by the team on the cluster."""

    team_id: int
    cluster: str
    gpus: int

    def values(self) -> dict[str, Any]:
        return asdict(self)


def add_held(session: Session, change: HeldChange) -> None:
    """Apply ``change`` to the team's count on the cluster."""
    statement = upsert(session.get_bind().dialect.name)
    plain.execute(session, statement, [change.values()])  # no ORM objects to sync


@lru_cache(maxsize=4)
def upsert(dialect_name: str, prefix: str = "") -> Insert:
    """The counter's upsert, its parameters ``prefix`` + a field of ``HeldChange``; built once
    per dialect: building it (its ``excluded`` columns) cost more than running it."""
    dialect = postgresql if dialect_name == "postgresql" else sqlite
    fields = HeldChange.__dataclass_fields__
    insert = dialect.insert(HeldGpus).values({key: bindparam(prefix + key) for key in fields})
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
