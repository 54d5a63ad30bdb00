"""attempt failure evidence: the classifier's lines and numbers, the runtime's measurements

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 16:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        # Existing attempts get an empty record; the model fills new ones.
        batch_op.add_column(
            sa.Column("failure_evidence", sa.JSON(), nullable=False, server_default="{}")
        )
        batch_op.add_column(
            sa.Column("runtime_evidence", sa.JSON(), nullable=False, server_default="{}")
        )


def downgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.drop_column("runtime_evidence")
        batch_op.drop_column("failure_evidence")
