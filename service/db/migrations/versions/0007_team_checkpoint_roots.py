"""checkpoint roots per team (where its jobs may name their own checkpoint.dir); how long
each checkpoint took to save (a stop's grace is sized from it)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 07:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("team", schema=None) as batch_op:
        # No team has a root yet: a job that names a checkpoint.dir is refused until an admin
        # sets one (the service's own folder per job needs none).
        batch_op.add_column(
            sa.Column("checkpoint_roots", sa.JSON(), nullable=False, server_default="[]")
        )

    with op.batch_alter_table("checkpoint", schema=None) as batch_op:
        batch_op.add_column(sa.Column("save_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoint", schema=None) as batch_op:
        batch_op.drop_column("save_seconds")
    with op.batch_alter_table("team", schema=None) as batch_op:
        batch_op.drop_column("checkpoint_roots")
