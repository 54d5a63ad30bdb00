"""SQLModel tables: teams, users, jobs, attempts, job events, metric points, checkpoints, and
what the advisor learns from finished attempts (observations, each cluster's calibration).

Status columns are written only through ``service.db.transitions``; everything else here is plain
storage. Specs and plans are stored as JSON exactly as validated, so a job can be re-planned or
audited later.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, Index, String, UniqueConstraint
from sqlmodel import Field, SQLModel

from service.core.attempt_kinds import AttemptKind
from service.core.states import AttemptStatus, JobStatus


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """A stored time, aware: SQLite gives back naive datetimes (stored as UTC)."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def new_id() -> str:
    return secrets.token_hex(8)


class Team(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True, index=True, max_length=64)
    gpu_quota: int | None = None  # GPUs its admitted jobs may hold at once; None: no limit
    gpu_share: int = 1  # fair-share weight among teams waiting for the same cluster
    borrow_limit: int | None = None  # GPUs past its quota it may borrow (borrowing on); None: any
    # Folders (set by an admin) where the team's jobs may name their own checkpoint.dir.
    checkpoint_roots: list[str] = Field(
        default_factory=list, sa_column=Column(JSON, nullable=False, server_default="[]")
    )
    created_at: datetime = Field(default_factory=utcnow)


class AdmissionTurn(SQLModel, table=True):
    """One row; every admission pass updates it first, so passes run one at a time."""

    id: int = Field(default=1, primary_key=True)
    turns: int = Field(default=0, sa_type=BigInteger)


class ReconcileLease(SQLModel, table=True):
    """One row: the reconcile pass that holds it (until ``expires_unix_s``) is the only one
    running, whichever worker runs it; a worker lost mid-pass lets it lapse."""

    id: int = Field(default=1, primary_key=True)
    holder: str = Field(default="", max_length=64)
    expires_unix_s: float = 0.0


class HeldGpus(SQLModel, table=True):
    """GPUs held by admitted, unfinished jobs per team and cluster, so that admitting one job
    reads a few counters instead of every admitted job. Only ``service.db.transitions``
    changes them, in the transaction that moves a job into or out of a holding status."""

    team_id: int = Field(foreign_key="team.id", primary_key=True)
    cluster: str = Field(primary_key=True, max_length=64)
    gpus: int = 0


class ClusterBound(SQLModel, table=True):
    """A limit on a cluster's GPUs that zeropilot did not set and a worker read there (a
    Kubernetes namespace's ResourceQuota): admission bounds the cluster by it as by the
    profile's ``max_gpus``. One row per cluster, replaced at each read, gone once none applies."""

    cluster: str = Field(primary_key=True, max_length=64)
    gpus: int
    source: str = Field(max_length=500)  # in words, e.g. "namespace quota ml/gpus: requests...=16"
    observed_at: datetime = Field(default_factory=utcnow)


class User(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True, index=True, max_length=64)
    team_id: int = Field(foreign_key="team.id", index=True)
    is_admin: bool = False
    role: str = Field(default="member", sa_type=String(16))  # service.core.roles.Role
    token_hash: str = Field(unique=True, index=True, max_length=64)  # sha256 of the bearer token
    created_at: datetime = Field(default_factory=utcnow)


class Job(SQLModel, table=True):
    __table_args__ = (
        UniqueConstraint("team_id", "idempotency_key", name="uq_job_team_idempotency_key"),
        Index("ix_job_team_created", "team_id", "created_at"),
        # A submit asks "is anything waiting in my team, or on my cluster?" without a scan.
        Index("ix_job_status_team", "status", "team_id"),
        Index("ix_job_status_cluster", "status", "cluster"),
    )

    id: str = Field(default_factory=new_id, primary_key=True, max_length=16)
    name: str = Field(max_length=64)
    team_id: int = Field(foreign_key="team.id")
    user_id: int = Field(foreign_key="user.id")
    # Plain strings, not database enums: a new status must not need a type migration.
    status: str = Field(default=JobStatus.PENDING, index=True, sa_type=String(16))
    priority: int = 50
    cluster: str = Field(max_length=64)
    # nodes x GPUs per node, from the spec: admission and the queue read it without the spec
    gpus: int
    # Its length (the spec's training.steps) and its plan's predicted step time: when its GPUs
    # free up, which placement reads for the jobs after it without loading spec or plan.
    steps: int | None = None
    step_s: float | None = None
    time_limit_s: float | None = None  # resources.time_limit_minutes: its end without steps
    # While it waits: when it is predicted to start and end (service.core.forecast), what that
    # rests on, when it was predicted; the first prediction of this wait, whose error is kept
    # once it starts (admitted onto its GPUs: seconds late, negative when early).
    predicted_start_at: datetime | None = None
    predicted_end_at: datetime | None = None
    prediction_basis: str = Field(default="", sa_column_kwargs={"server_default": ""})
    predicted_at: datetime | None = None
    first_predicted_start_at: datetime | None = None
    first_predicted_at: datetime | None = None
    start_prediction_error_s: float | None = None
    # When placement last chose its cluster (cluster: auto only; None: the spec named it): a
    # waiting job is re-placed only some time after (service.core.waiting_placement).
    placed_at: datetime | None = None
    spec: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    plan: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    advice_reason: str = ""
    current_attempt: int = 0
    failure_class: str | None = Field(default=None, max_length=32)
    message: str = ""
    # Sharing (docs/scheduling.md): admitted past its team's quota; the jobs that preempted
    # it (never its victims in turn); the job it is stopping for, while it saves.
    borrowing: bool = False
    requeued_at: datetime | None = None  # put back in line by its last preemption
    preempted_by: list[str] = Field(
        default_factory=list, sa_column=Column(JSON, nullable=False, server_default="[]")
    )
    stopping_for: str | None = Field(default=None, max_length=16)
    idempotency_key: str | None = Field(default=None, max_length=255)
    spec_digest: str = Field(
        max_length=64
    )  # sha256 of the canonical spec, for Idempotency-Key reuse
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class Attempt(SQLModel, table=True):
    __table_args__ = (UniqueConstraint("job_id", "number", name="uq_attempt_job_number"),)

    id: str = Field(default_factory=new_id, primary_key=True, max_length=16)
    job_id: str = Field(foreign_key="job.id", index=True, max_length=16)
    number: int
    status: str = Field(default=AttemptStatus.QUEUED, index=True, sa_type=String(16))
    plan: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    # Why it exists (service.core.attempt_kinds: the budgets count kinds); attempt 1: advisor
    kind: str = Field(default=AttemptKind.ADVISOR, sa_type=String(16))
    rung: str = ""  # the same, in a person's words: "advisor", the escalation step, the retry
    backend: str = Field(max_length=16)
    backend_name: str = Field(max_length=63)  # deterministic object/job name on the cluster
    backend_ref: str | None = None
    native_state: str = ""
    exit_code: int | None = None
    failure_class: str | None = Field(default=None, max_length=32)
    failure_message: str = ""
    runtime_failure_tag: str | None = Field(default=None, max_length=32)
    # The classifier's verdict: class, the lines that show it, the numbers parsed from them.
    failure_evidence: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False, server_default="{}")
    )
    # What the training processes measured: device memory per rank at start, numbers at failure.
    runtime_evidence: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False, server_default="{}")
    )
    resumed_from: str | None = None  # checkpoint path this attempt resumed from
    resume_method: str | None = None  # zeropilot.resume.ResumeMethod
    # The launch (workers.launch): failed tries so far, the last one's error, and the cluster
    # where the launch failed for good (never chosen for the job again).
    launch_tries: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    launch_error: str | None = None
    launch_cluster: str | None = Field(default=None, max_length=64)
    # The graceful stop's grace, chosen at its first SIGTERM and kept for every one after
    stop_grace_s: float | None = None
    stop_grace: str | None = None  # why that grace, in words
    log_path: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None


class JobEvent(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id", index=True, max_length=16)
    attempt_number: int | None = None
    subject: str = Field(max_length=8)  # "job" or "attempt"
    from_status: str | None = Field(default=None, max_length=16)
    to_status: str = Field(max_length=16)
    reason: str = ""
    created_at: datetime = Field(default_factory=utcnow)


class MetricPoint(SQLModel, table=True):
    __table_args__ = (UniqueConstraint("attempt_id", "step", name="uq_metric_attempt_step"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id", index=True, max_length=16)
    attempt_id: str = Field(foreign_key="attempt.id", max_length=16)
    step: int
    loss: float | None = None
    tokens_per_s: float | None = None
    memory_peak_bytes: int | None = Field(default=None, sa_type=BigInteger)
    extra: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow)


class Checkpoint(SQLModel, table=True):
    # The worker's retention pass finds the checkpoints it has not looked at yet.
    __table_args__ = (Index("ix_checkpoint_unchecked", "checked_at"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id", index=True, max_length=16)
    attempt_id: str = Field(foreign_key="attempt.id", max_length=16)
    step: int
    path: str
    tag: str | None = None
    save_seconds: float | None = None  # reported by the training code
    # What the worker found on disk (workers.retention): every rank's files there, the bytes.
    complete: bool | None = None
    size_bytes: int | None = Field(default=None, sa_type=BigInteger)
    checked_at: datetime | None = None
    deleted_at: datetime | None = None  # retention deleted it; the row stays, for the history
    created_at: datetime = Field(default_factory=utcnow)


class AttemptObservation(SQLModel, table=True):
    """What the advisor predicted and the attempt measured, once it ended (service.db.learning);
    ``skipped`` says why an attempt is not learnt from ("": it is)."""

    attempt_id: str = Field(foreign_key="attempt.id", primary_key=True, max_length=16)
    job_id: str = Field(foreign_key="job.id", max_length=16)
    cluster: str = Field(index=True, max_length=64)
    accelerator: str = Field(max_length=64)
    spec: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    plan: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))  # the Candidate
    predicted_step_seconds: float | None = None  # the plan's, when it was made
    predicted_peak_bytes: int | None = Field(default=None, sa_type=BigInteger)
    step_seconds: float | None = None  # median of the steady steps; None: not learnt from
    steady_steps: int = 0
    peak_bytes: int | None = Field(default=None, sa_type=BigInteger)  # rank 0's, as reported
    peak_kind: str = Field(default="allocated", max_length=16)
    neighbours: int = 0  # other attempts on the same device while it ran
    skipped: str = ""
    created_at: datetime = Field(default_factory=utcnow, index=True)


class ClusterCalibrationRow(SQLModel, table=True):
    """One cluster's fitted constants (multipliers over the advisor's) and operator control."""

    __tablename__ = "clustercalibration"

    cluster: str = Field(primary_key=True, max_length=64)
    multipliers: dict[str, float] = Field(
        default_factory=dict, sa_column=Column(JSON, nullable=False)
    )
    gpu_share: float = 0.0  # the memory correction (service.core.advisor.calibration_memory)
    cpu_share: float = 0.0
    observations: int = 0  # how many the fit used
    typical_error: float = 0.0
    memory_reason: str = ""
    frozen: bool = False  # an operator froze it: new observations are kept, not fitted
    fitted_at: datetime | None = None
    learn_since: datetime | None = None  # a reset forgets the observations before it
    imported_from: str | None = Field(default=None, max_length=64)  # until its own runs refit
    updated_at: datetime = Field(default_factory=utcnow)
