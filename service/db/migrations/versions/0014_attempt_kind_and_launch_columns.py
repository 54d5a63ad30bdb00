"""each attempt's kind (why it exists: the budgets count kinds, not rung words), read from the
rungs stored before; the launch's tries, error and failed cluster and the stop's grace as columns,
moved out of failure_evidence (which keeps the classifier's evidence alone)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 10:00:00.000000
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# The rung words each recovery wrote up to 0013 (fixed here: later code may word them otherwise)
EXACT = {"advisor": "advisor", "retry: other processes held the GPU": "oom_retry"}
PREFIXES = {
    "retry after a disruption": "disruption",
    "resume after a stop": "stop",
    "resume after preemption": "preemption",
    "re-placed on": "replacement",
}
MOVED = ("launch_tries", "launch_error", "launch_cluster", "stop_grace_s", "stop_grace")

attempt = sa.table(
    "attempt",
    sa.column("id", sa.String()),
    sa.column("rung", sa.String()),
    sa.column("kind", sa.String()),
    sa.column("failure_evidence", sa.JSON()),
    sa.column("launch_tries", sa.Integer()),
    sa.column("launch_error", sa.String()),
    sa.column("launch_cluster", sa.String()),
    sa.column("stop_grace_s", sa.Float()),
    sa.column("stop_grace", sa.String()),
)


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("kind", sa.String(length=16), nullable=True))
        batch_op.add_column(
            sa.Column("launch_tries", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(
            sa.Column("launch_error", sqlmodel.sql.sqltypes.AutoString(), nullable=True)
        )
        batch_op.add_column(
            sa.Column("launch_cluster", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True)
        )
        batch_op.add_column(sa.Column("stop_grace_s", sa.Float(), nullable=True))
        batch_op.add_column(
            sa.Column("stop_grace", sqlmodel.sql.sqltypes.AutoString(), nullable=True)
        )
    op.execute(attempt.update().values(kind=_kind_of_rung()))
    _fill_moved_columns()
    with op.batch_alter_table("attempt", schema=None) as batch_op:  # SQLite: NOT NULL rebuilds
        batch_op.alter_column("kind", existing_type=sa.String(length=16), nullable=False)


def downgrade() -> None:
    _put_back_into_evidence()
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        for name in ("kind", *MOVED):
            batch_op.drop_column(name)


def _kind_of_rung() -> sa.Case[Any]:
    """Compared exactly (``substr``, not LIKE): LIKE ignores case on SQLite and not elsewhere."""
    rung = attempt.c.rung
    whens = [(rung == words, kind) for words, kind in EXACT.items()]
    whens += [(sa.func.substr(rung, 1, len(p)) == p, kind) for p, kind in PREFIXES.items()]
    return sa.case(*whens, else_="escalation")


def _fill_moved_columns() -> None:
    evidence = attempt.c.failure_evidence
    op.execute(
        attempt.update().values(
            launch_tries=sa.func.coalesce(evidence["launch_tries"].as_integer(), 0),
            launch_error=evidence["launch_error"].as_string(),
            launch_cluster=evidence["launch_cluster"].as_string(),
            stop_grace_s=evidence["stop_grace_s"].as_float(),
            stop_grace=evidence["stop_grace"].as_string(),
        )
    )
    rows = _rows_with_moved_values()
    _write_evidence([(row.id, _without_moved(row.failure_evidence)) for row in rows])


def _put_back_into_evidence() -> None:
    rows = _rows_with_moved_values()
    _write_evidence([(row.id, {**row.failure_evidence, **_moved_values(row)}) for row in rows])


def _rows_with_moved_values() -> list[sa.Row[Any]]:
    c = attempt.c
    held = [c.launch_tries > 0, *(c[name].is_not(None) for name in MOVED[1:])]
    query = sa.select(c.id, c.failure_evidence, *(c[name] for name in MOVED)).where(sa.or_(*held))
    return list(op.get_bind().execute(query))


def _write_evidence(changes: list[tuple[str, dict[str, Any]]]) -> None:
    if not changes:
        return
    statement = (
        attempt.update()
        .where(attempt.c.id == sa.bindparam("row_id"))
        .values(failure_evidence=sa.bindparam("evidence", type_=sa.JSON()))
    )
    op.get_bind().execute(statement, [{"row_id": i, "evidence": e} for i, e in changes])


def _without_moved(evidence: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in evidence.items() if key not in MOVED}


def _moved_values(row: sa.Row[Any]) -> dict[str, Any]:
    values = {name: getattr(row, name) for name in MOVED if getattr(row, name) is not None}
    if values.get("launch_tries") == 0:  # 0013 wrote the key only from the first failed try
        del values["launch_tries"]
    return values
