"""each waiting job's predicted start and end (what they rest on, when made, the first one of
its wait) and, once it starts, that first prediction's error; its time limit as a column, read
from the spec stored before (an end for jobs without steps)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

TIMES = ("predicted_start_at", "predicted_end_at", "predicted_at", "first_predicted_start_at",
         "first_predicted_at")  # fmt: skip

job = sa.table("job", sa.column("spec", sa.JSON()), sa.column("time_limit_s", sa.Float()))


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("time_limit_s", sa.Float(), nullable=True))
        for name in TIMES:
            batch_op.add_column(sa.Column(name, sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True))
        batch_op.add_column(
            sa.Column(
                "prediction_basis",
                sqlmodel.sql.sqltypes.AutoString(),
                nullable=False,
                server_default="",
            )
        )
        batch_op.add_column(sa.Column("start_prediction_error_s", sa.Float(), nullable=True))
    minutes = job.c.spec["resources"]["time_limit_minutes"].as_float()
    op.execute(job.update().values(time_limit_s=minutes * 60))


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        for name in ("time_limit_s", *TIMES, "prediction_basis", "start_prediction_error_s"):
            batch_op.drop_column(name)
