"""borrow limit per team: how many GPUs past its quota it may borrow (null: no limit); when a
preempted job was put back in line (its borrowing back-off counts from then); a job's length
in steps and predicted step time (when its GPUs free up, for placement)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 14:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("team", schema=None) as batch_op:
        batch_op.add_column(sa.Column("borrow_limit", sa.Integer(), nullable=True))
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("requeued_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True)
        )
        batch_op.add_column(sa.Column("steps", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("step_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("step_s")
        batch_op.drop_column("steps")
        batch_op.drop_column("requeued_at")
    with op.batch_alter_table("team", schema=None) as batch_op:
        batch_op.drop_column("borrow_limit")
