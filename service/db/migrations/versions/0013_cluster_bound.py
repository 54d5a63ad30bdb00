"""limits on a cluster's GPUs read on the cluster (a Kubernetes namespace's GPU quota), which
admission applies beside the profile's max_gpus

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04 15:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "clusterbound",
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=500), nullable=False),
        sa.Column("observed_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("cluster"),
    )


def downgrade() -> None:
    op.drop_table("clusterbound")
