"""sharing: whether a job borrows, who preempted it, whom it is stopping for

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 07:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        # Every job stored before admitted within its quota and was never preempted.
        batch_op.add_column(
            sa.Column("borrowing", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(
            sa.Column("preempted_by", sa.JSON(), nullable=False, server_default="[]")
        )
        batch_op.add_column(sa.Column("stopping_for", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("stopping_for")
        batch_op.drop_column("preempted_by")
        batch_op.drop_column("borrowing")
