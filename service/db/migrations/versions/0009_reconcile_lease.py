"""the reconcile lease: one pass at a time across workers

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 08:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    lease = op.create_table(
        "reconcilelease",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False),
        sa.Column("expires_unix_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.bulk_insert(lease, [{"id": 1, "holder": "", "expires_unix_s": 0.0}])  # lapsed: free


def downgrade() -> None:
    op.drop_table("reconcilelease")
