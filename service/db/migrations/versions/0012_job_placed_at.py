"""when placement last chose a cluster: auto job's cluster (a waiting job is re-placed only
some time after; null for a job whose spec names its cluster, and for jobs stored before)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 18:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("placed_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("placed_at")
