"""Each job's GPUs (nodes x GPUs per node) as a column, so admission reads no spec

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 07:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("job", sa.Column("gpus", sa.Integer(), nullable=True))
    job = sa.table("job", sa.column("gpus"), sa.column("spec", sa.JSON()))
    nodes = job.c.spec[("resources", "nodes")].as_integer()
    per_node = job.c.spec[("resources", "gpus_per_node")].as_integer()
    op.execute(job.update().values(gpus=nodes * per_node))
    with op.batch_alter_table("job") as batch_op:  # SQLite: NOT NULL needs the table rebuilt
        batch_op.alter_column("gpus", existing_type=sa.Integer(), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("job") as batch_op:
        batch_op.drop_column("gpus")
