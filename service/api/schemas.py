"""The wire contract of the HTTP API, separate from the tables it is read from."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, RootModel

from service.core.advisor.calibration_time import KNOBS
from service.core.attempt_kinds import AttemptKind
from service.core.limits import INT32_MAX, INT64_MAX
from service.core.roles import Role
from service.core.states import AttemptStatus, JobStatus
from service.core.stopping import MAX_SAVE_SECONDS
from service.core.text import Text
from zeropilot.resume import ResumeMethod

Bytes = Annotated[int, Field(ge=0, le=INT64_MAX)]


class Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class JobPublic(Public):
    id: str
    name: str
    team: str
    status: JobStatus
    priority: int
    cluster: str
    current_attempt: int
    borrowing: bool  # admitted past its team's quota, on GPUs others do not use now
    preempted_by: list[str]  # jobs that stopped it to start, one per preemption (scheduling.md)
    failure_class: str | None
    message: str
    # While it waits: when it is predicted to start and end (None: not known), what that rests
    # on, when it was made; once started, how late it started against its wait's first
    # prediction, in seconds (negative: early). docs/scheduling.md, "Predicted starts".
    predicted_start_at: datetime | None = None
    predicted_end_at: datetime | None = None
    prediction_basis: str = ""
    predicted_at: datetime | None = None
    first_predicted_start_at: datetime | None = None
    start_prediction_error_s: float | None = None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class AttemptPublic(Public):
    id: str
    number: int
    status: AttemptStatus
    kind: AttemptKind  # why it exists; the budgets count kinds (service.core.attempt_kinds)
    rung: str
    plan: dict[str, Any]
    backend: str
    backend_name: str
    backend_ref: str | None
    native_state: str
    exit_code: int | None
    failure_class: str | None
    failure_message: str
    failure_evidence: dict[str, Any]  # class, the lines that show it, the numbers parsed
    # What the training reported of its own end: OOM, or PREEMPTED when it saved at a stop
    runtime_failure_tag: str | None
    runtime_evidence: dict[str, Any]  # device memory per rank at start, numbers at failure
    resumed_from: str | None
    resume_method: ResumeMethod | None
    launch_tries: int  # failed launch tries so far
    launch_error: str | None  # the last failed try's error
    launch_cluster: str | None  # where its launch failed for good
    stop_grace_s: float | None  # the grace of its graceful stop, once one was sent
    stop_grace: str | None  # why that grace
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class EventPublic(Public):
    id: int
    subject: str
    attempt_number: int | None
    from_status: str | None
    to_status: str
    reason: str
    created_at: datetime


class MetricPublic(Public):
    id: int
    attempt_id: str
    step: int
    loss: float | None
    tokens_per_s: float | None
    memory_peak_bytes: int | None
    extra: dict[str, float] = {}  # what else the training code reported (learning_rate, ...)
    created_at: datetime


class CheckpointPublic(Public):
    id: int
    attempt_id: str
    step: int
    path: str
    tag: str | None
    save_seconds: float | None  # how long the training code took to write it
    # What the worker's retention pass found: every rank's files there; its bytes on disk
    complete: bool | None = None
    size_bytes: int | None = None
    deleted_at: datetime | None = None  # retention deleted it (checkpoint.keep_last, ...)
    created_at: datetime


class GoodputPublic(BaseModel):
    """GPU-seconds held (from processes running to their end, times the GPUs) and where they
    went; docs/goodput.md defines each cause."""

    gpu_seconds: float
    productive_gpu_seconds: float  # work kept: resumed from, or the final result
    goodput: float | None  # productive / held; None before any GPU time
    lost_gpu_seconds: dict[str, float]  # by cause: startup, checkpointing, redone, hang, ...


class AttemptGoodputPublic(GoodputPublic):
    number: int


class JobGoodputPublic(GoodputPublic):
    mfu: float | None  # model FLOPs/s at the measured pace over the GPUs' peak
    tokens_per_s: float | None  # that pace: the median of the latest reported points
    attempts: list[AttemptGoodputPublic]


class TeamReport(BaseModel):
    """The showback of a team's GPU time in [since, until]: used, kept, lost by cause, cost."""

    team: str
    since: datetime
    until: datetime
    jobs: int  # jobs that held GPUs in the window
    gpu_hours: float
    productive_gpu_hours: float
    goodput: float | None
    lost_gpu_hours: dict[str, float]  # by cause (docs/goodput.md)
    cost_usd: float | None  # GPU-hours on priced clusters x usd_per_gpu_hour; None: none priced
    lost_cost_usd: float | None  # of that, the lost hours'
    unpriced_gpu_hours: float  # on clusters whose profile sets no price


class JobDetail(JobPublic):
    spec: dict[str, Any]
    plan: dict[str, Any]
    advice_reason: str
    attempts: list[AttemptPublic]
    events: list[EventPublic]
    metrics: list[MetricPublic]
    checkpoints: list[CheckpointPublic]
    checkpoint_bytes: int = 0  # of the checkpoints retention keeps, as last measured
    goodput: JobGoodputPublic | None = None  # None until it has held GPUs


class ProgressPublic(BaseModel):
    """A long poll's answer: whether the job moved past what the caller had seen, and where
    it stands (send these back as the next wait's ``status``, ``events_after``, ...)."""

    changed: bool
    status: JobStatus
    last_event_id: int
    last_metric_id: int


class LogsPublic(BaseModel):
    attempt: int
    text: str


class Report(BaseModel):
    """What a training process sends: finite numbers within the columns' ranges."""

    # strict: true is not a step and "5" is not a byte count, as the OpenAPI schema says
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class MetricReport(Report):
    step: int = Field(ge=0, le=INT32_MAX)
    loss: float | None = None
    tokens_per_s: float | None = Field(default=None, ge=0)
    memory_peak_bytes: int | None = Field(default=None, ge=0, le=INT64_MAX)
    extra: dict[Annotated[str, Field(max_length=64)], float] = Field(
        default_factory=dict, max_length=64
    )


# Points in one metrics report: the runtime sends what gathered in a second, in one request.
METRIC_POINTS_PER_REPORT = 1000


class MetricReports(RootModel[list[MetricReport]]):
    """Several steps' points in one request, oldest first."""

    root: list[MetricReport] = Field(min_length=1, max_length=METRIC_POINTS_PER_REPORT)


class MetricsAnswer(BaseModel):
    """What the runtime learns from a metrics report: the steps between saves it should use
    now (the job's setting, or with ``auto`` the interval from measurements)."""

    checkpoint_interval_steps: int


class CheckpointReport(Report):
    step: int = Field(ge=0, le=INT32_MAX)
    path: Annotated[Text, Field(min_length=1)]
    tag: Annotated[Text, Field(max_length=255)] | None = None
    # How long the save took: a stop's grace period is sized from it.
    seconds: float | None = Field(default=None, ge=0, le=MAX_SAVE_SECONDS, allow_inf_nan=False)


class FailureReport(Report):
    failure_class: str = Field(pattern=r"^[A-Z_]{2,32}$")
    message: Annotated[Text, Field(max_length=4000)] = ""
    # What the process measured as it failed, e.g. tried, in-use and limit bytes.
    evidence: dict[Annotated[str, Field(pattern=r"^[a-z_]{1,40}$")], Bytes] = Field(
        default_factory=dict, max_length=32
    )


class DeviceReport(Report):
    """One rank's device memory as it starts training (the host's, on a CPU rank)."""

    rank: int = Field(ge=0, le=INT32_MAX)
    device_free_bytes: Bytes
    device_total_bytes: Bytes
    # Other figures: this process's share, other processes' share, limits.
    numbers: dict[Annotated[str, Field(pattern=r"^[a-z_]{1,40}$")], Bytes] = Field(
        default_factory=dict, max_length=32
    )


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
    team: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
    # strict: 0, 1 and "true" are not booleans, and granting a service admin must be meant
    is_admin: bool = Field(default=False, strict=True)
    role: Role = Role.MEMBER  # inside the team: member, viewer (read-only) or team-admin


class UserCreated(BaseModel):
    name: str
    team: str
    is_admin: bool
    role: Role
    token: str  # shown once; only its hash is stored


class Me(BaseModel):
    name: str
    team: str
    is_admin: bool
    role: Role


def _absolute_folder(path: str) -> str:
    if not os.path.isabs(path):
        raise ValueError(f"{path!r} is not an absolute path")
    return os.path.normpath(path)


# A folder on the storage the API, the workers and the ranks all see, written out in full.
CheckpointRoot = Annotated[Text, AfterValidator(_absolute_folder)]


class TeamPublic(BaseModel):
    name: str
    gpu_quota: int | None  # GPUs its admitted jobs may hold at once; null: no limit
    gpu_share: int  # fair-share weight
    gpus_held: int  # by its admitted, unfinished jobs
    gpu_borrow_limit: int | None  # GPUs past its quota it may borrow; null: no limit
    gpus_borrowed: int  # held past its quota, on other teams' idle GPUs (docs/scheduling.md)
    gpus_lent: int  # of its idle quota, what other teams' borrowing jobs use now
    jobs_waiting: int  # PENDING, waiting for admission
    checkpoint_roots: list[str]  # where its jobs may name their own checkpoint.dir


class TeamUpdate(BaseModel):
    """Fields left out stay as they are; ``gpu_quota: null`` removes the limit."""

    model_config = ConfigDict(extra="forbid")
    # strict: true, "8" and 8.0 are refused, not read as a quota of 1 and of 8
    gpu_quota: int | None = Field(default=None, ge=1, le=INT32_MAX, strict=True)
    gpu_share: int = Field(default=1, ge=1, le=1000, strict=True)
    # with borrowing on: GPUs past its quota it may borrow; null: no limit, 0: never borrows
    gpu_borrow_limit: int | None = Field(default=None, ge=0, le=INT32_MAX, strict=True)
    checkpoint_roots: list[CheckpointRoot] = Field(default_factory=list, max_length=16)


FITTED_CONSTANTS = frozenset(k.name for k in KNOBS)


def _known_constant(name: str) -> str:
    if name not in FITTED_CONSTANTS:
        raise ValueError(f"not a fitted constant: {name!r}; they are {sorted(FITTED_CONSTANTS)}")
    return name


class ObservationPublic(BaseModel):
    """One ended attempt as the advisor learnt from it (or why it did not)."""

    attempt_id: str
    job_id: str
    predicted_step_seconds: float | None  # the plan's, when it was made
    step_seconds: float | None  # median of the steady steps; null: not learnt from
    neighbours: int  # other attempts on its device while it ran (they weigh it down)
    peak_bytes: int | None
    peak_kind: str  # resident (CPU ranks), allocated or reserved (GPUs)
    skipped: str  # why it is not learnt from ("": it is)
    created_at: datetime


class CalibrationPublic(BaseModel):
    cluster: str
    observations: int  # how many the stored fit used; 0: the advisor's own constants
    typical_error: float  # median |predicted / measured - 1| of step time after the fit
    multipliers: dict[str, float]  # each fitted constant over the advisor's
    gpu_memory_share: float  # added to the allocator's share of a step's transient bytes
    cpu_memory_share: float
    memory_reason: str
    frozen: bool
    fitted_at: datetime | None
    learn_since: datetime | None  # the last reset: observations before it are not learnt from
    imported_from: str | None  # the cluster these constants came from, until its own runs refit
    recent: list[ObservationPublic]  # the latest, newest first


class CalibrationImport(BaseModel):
    """Another cluster's calibration as ``GET`` (``zeropilot calibration export``) gave it."""

    model_config = ConfigDict(extra="ignore")  # the rest of an export: recent runs, dates
    cluster: str = Field(max_length=64)  # where it was learnt
    observations: int = Field(ge=1, le=INT32_MAX)
    typical_error: float = Field(ge=0, le=100)
    multipliers: dict[Annotated[str, AfterValidator(_known_constant)], Annotated[float, Field(
        ge=0.1, le=10)]] = Field(max_length=16)  # fmt: skip
    gpu_memory_share: float = Field(ge=-0.05, le=1.0)  # the memory rule's bounds
    cpu_memory_share: float = Field(ge=-0.05, le=1.0)
    memory_reason: str = Field(default="", max_length=2000)


class CalibrationUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    frozen: bool = Field(strict=True)  # true: keep the constants as they are
