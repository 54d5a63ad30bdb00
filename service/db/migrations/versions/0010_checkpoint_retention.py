"""checkpoint retention: whether each checkpoint was found complete, its bytes, when it was
checked and when retention deleted it

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 08:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoint", schema=None) as batch_op:
        # Unchecked until the worker's next pass; nothing stored before is deleted unchecked.
        batch_op.add_column(sa.Column("complete", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("size_bytes", sa.BigInteger(), nullable=True))
        batch_op.add_column(
            sa.Column("checked_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True)
        )
        batch_op.add_column(
            sa.Column("deleted_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True)
        )
        batch_op.create_index("ix_checkpoint_unchecked", ["checked_at"])


def downgrade() -> None:
    with op.batch_alter_table("checkpoint", schema=None) as batch_op:
        batch_op.drop_index("ix_checkpoint_unchecked")
        for column in ("deleted_at", "checked_at", "size_bytes", "complete"):
            batch_op.drop_column(column)
