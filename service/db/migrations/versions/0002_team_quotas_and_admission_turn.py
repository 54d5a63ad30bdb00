"""team quotas, fair-share weights and the admission turn

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 05:34:01.492180
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    turn = op.create_table(
        "admissionturn",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("turns", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.bulk_insert(turn, [{"id": 1, "turns": 0}])  # the one row every admission pass locks
    with op.batch_alter_table("team", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpu_quota", sa.Integer(), nullable=True))
        # Existing teams get weight 1; the model sets it for new ones.
        batch_op.add_column(
            sa.Column("gpu_share", sa.Integer(), nullable=False, server_default="1")
        )


def downgrade() -> None:
    with op.batch_alter_table("team", schema=None) as batch_op:
        batch_op.drop_column("gpu_share")
        batch_op.drop_column("gpu_quota")
    op.drop_table("admissionturn")
