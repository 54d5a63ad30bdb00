"""GPUs held per team and cluster as counters; indexes for "is anything waiting here?"

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 20:05:00.000000
"""

from __future__ import annotations

from collections import Counter

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# service.core.admission.HOLDING as it stood when this migration was written.
HOLDING = ("QUEUED", "LAUNCHING", "RUNNING", "ESCALATING")


def upgrade() -> None:
    held = op.create_table(
        "heldgpus",
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["team_id"], ["team.id"]),
        sa.PrimaryKeyConstraint("team_id", "cluster"),
    )
    op.create_index("ix_job_status_team", "job", ["status", "team_id"])
    op.create_index("ix_job_status_cluster", "job", ["status", "cluster"])
    op.bulk_insert(held, _held_now())


def _held_now() -> list[dict[str, object]]:
    """What the admitted, unfinished jobs hold now, summed from their specs."""
    job = sa.table(
        "job", sa.column("team_id"), sa.column("cluster"), sa.column("status"),
        sa.column("spec", sa.JSON()),
    )  # fmt: skip
    rows = op.get_bind().execute(
        sa.select(job.c.team_id, job.c.cluster, job.c.spec).where(job.c.status.in_(HOLDING))
    )
    totals: Counter[tuple[int, str]] = Counter()
    for team_id, cluster, spec in rows:
        resources = spec["resources"]
        totals[(team_id, cluster)] += int(resources["nodes"]) * int(resources["gpus_per_node"])
    return [{"team_id": t, "cluster": c, "gpus": gpus} for (t, c), gpus in totals.items()]


def downgrade() -> None:
    op.drop_index("ix_job_status_cluster", table_name="job")
    op.drop_index("ix_job_status_team", table_name="job")
    op.drop_table("heldgpus")
