"""what the advisor learns from finished attempts: an observation per attempt and each
cluster's calibration

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "attemptobservation",
        sa.Column("attempt_id", sa.String(length=16), sa.ForeignKey("attempt.id"), nullable=False),
        sa.Column("job_id", sa.String(length=16), sa.ForeignKey("job.id"), nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("accelerator", sa.String(length=64), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("predicted_step_seconds", sa.Float(), nullable=True),
        sa.Column("predicted_peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("step_seconds", sa.Float(), nullable=True),
        sa.Column("steady_steps", sa.Integer(), nullable=False),
        sa.Column("peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("peak_kind", sa.String(length=16), nullable=False),
        sa.Column("neighbours", sa.Integer(), nullable=False),
        sa.Column("skipped", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("attempt_id"),
    )
    op.create_index("ix_attemptobservation_cluster", "attemptobservation", ["cluster"])
    op.create_index("ix_attemptobservation_created_at", "attemptobservation", ["created_at"])
    op.create_table(
        "clustercalibration",
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("multipliers", sa.JSON(), nullable=False),
        sa.Column("gpu_share", sa.Float(), nullable=False),
        sa.Column("cpu_share", sa.Float(), nullable=False),
        sa.Column("observations", sa.Integer(), nullable=False),
        sa.Column("typical_error", sa.Float(), nullable=False),
        sa.Column("memory_reason", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("frozen", sa.Boolean(), nullable=False),
        sa.Column("fitted_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.Column("learn_since", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.Column("imported_from", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.Column("updated_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("cluster"),
    )


def downgrade() -> None:
    op.drop_table("clustercalibration")
    op.drop_index("ix_attemptobservation_created_at", "attemptobservation")
    op.drop_index("ix_attemptobservation_cluster", "attemptobservation")
    op.drop_table("attemptobservation")
