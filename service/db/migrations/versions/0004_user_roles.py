"""user roles inside a team: member, viewer, team-admin

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 20:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("user", schema=None) as batch_op:
        # Every existing user keeps what it could do: a member of its team.
        batch_op.add_column(
            sa.Column("role", sa.String(length=16), nullable=False, server_default="member")
        )


def downgrade() -> None:
    with op.batch_alter_table("user", schema=None) as batch_op:
        batch_op.drop_column("role")
