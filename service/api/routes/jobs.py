"""Job routes: submit, list, inspect, cancel, and read logs, metrics and checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials
from sqlmodel import Session, col, select

from service.api.deps import (
    Credentials,
    CurrentUser,
    SessionDep,
    SettingsDep,
    WriterUser,
    submitter_of,
)
from service.api.errors import error_responses
from service.api.job_progress import NoSuchJob, ProgressHub, Seen, ShuttingDown
from service.api.schemas import (
    AttemptPublic,
    CheckpointPublic,
    EventPublic,
    JobDetail,
    JobPublic,
    JobsPublic,
    LogsPublic,
    MetricPublic,
    ProgressPublic,
)
from service.checkpoint_paths import outside_roots, resolve_dir, root_holding
from service.contained_files import NotContained
from service.core.admission import Cap
from service.core.advice_memo import advise_once
from service.core.advisor import BadOverrides, ClusterTooSmall, NoPlanFits
from service.core.clusters import BackendKind, ClusterProfile
from service.core.limits import INT32_MAX, INT64_MAX
from service.core.placement import AUTO
from service.core.spec import JobSpec
from service.core.states import JobStatus
from service.db import jobs as job_store
from service.db.admission import WAITING_PREFIX, decide_submitted, refusal
from service.db.cluster_bounds import cap_of
from service.db.models import Checkpoint, Job, JobEvent, MetricPoint, Team, User
from service.db.new_job import writes_in_one_statement
from service.db.placing import place
from service.db.session import autocommit, get_engine
from service.db.transitions import move_job
from service.db.users import Caller, checkpoint_roots_of
from service.logtail import log_size, read_from, tail_lines
from service.metrics import ADVISOR_SECONDS
from service.settings import Settings
from service.tasks import CANCEL_ATTEMPT, LAUNCH_ATTEMPT, send_or_leave_to_sweep

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=error_responses(401))
# A job's detail carries at most this many of its latest events, metrics and checkpoints, so
# its size is bounded however long the job runs; /metrics pages through every point.
DETAIL_ROWS = 10_000
WAIT_MAX_S = 25.0  # a long poll's longest hold
WAIT_SHARE_OF_DEADLINE = 0.8
IDEMPOTENCY_KEY_MAX = 255
IDEMPOTENCY_KEY_PATTERN = r"^[!-~]+$"  # printable ASCII: PostgreSQL text cannot hold a NUL


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobDetail,
    responses=error_responses(403, 409),
)
async def create_job(
    spec: JobSpec,
    credentials: Credentials,
    settings: SettingsDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            max_length=IDEMPOTENCY_KEY_MAX,
            pattern=IDEMPOTENCY_KEY_PATTERN,
            description="a retried submit with the same key returns the job the first stored",
        ),
    ] = None,
) -> Response:
    """Validate, plan and store a job; its launch is queued once the row is committed."""
    # One hop to a worker thread for all of it (caller, session, submit): as dependencies and a
    # sync handler it took four, and the hops cost the API about as much CPU as the submit.
    return await run_in_threadpool(submit, spec, credentials, settings, idempotency_key)


def create_job_route() -> APIRoute:
    """The submit's route: its contract (OpenAPI, the refusals of a malformed request)."""
    return next(
        route
        for route in router.routes
        if isinstance(route, APIRoute)
        and route.path == router.prefix
        and "POST" in (route.methods or ())
    )


def submit(
    spec: JobSpec,
    credentials: HTTPAuthorizationCredentials | None,
    settings: Settings,
    idempotency_key: str | None,
) -> Response:
    engine = get_engine(settings.database_url)
    # Where a new job is one statement (PostgreSQL), atomic on its own, a submit under no limit
    # needs no transaction, and so sends no BEGIN and no COMMIT: two round trips of four (five
    # when the pooled connection sat idle and is pinged first).
    reads = autocommit(engine) if writes_in_one_statement(engine) else engine
    with Session(reads) as session:
        caller = submitter_of(session, credentials)
        if spec.resources.cluster == AUTO:
            profile, cap, placed = _place(session, caller, settings, spec)
        else:
            profile, placed = _profile_for(settings, spec), ""
            cap = cap_of(session, profile)
        if reads is engine or (caller.gpu_quota is None and cap.gpus is None):
            return _store_submitted(
                session, caller, spec, profile, cap, settings, idempotency_key, placed
            )
    with Session(engine) as session:  # a limit applies: decided and written in one transaction
        return _store_submitted(
            session, caller, spec, profile, cap, settings, idempotency_key, placed
        )


def _place(
    session: Session, caller: Caller, settings: Settings, spec: JobSpec
) -> tuple[ClusterProfile, Cap, str]:
    """``cluster: auto``: the profile placement chooses, its cap, and the choice in words."""
    profiles = settings.cluster_profiles()
    placed = place(session, spec, profiles, caller, borrowing=settings.scheduling.borrowing)
    if (chosen := placed.chosen) is None:
        why = placed.ruled_out() or "none configured"
        raise _unprocessable("resources.cluster", f"no cluster can run this job ({why})")
    return profiles[chosen.cluster], placed.caps[chosen.cluster], placed.summary()


def _store_submitted(
    session: Session,
    caller: Caller,
    spec: JobSpec,
    profile: ClusterProfile,
    cap: Cap,
    settings: Settings,
    idempotency_key: str | None,
    placed: str = "",
) -> Response:
    team = caller.team_name
    if spec.team is not None and spec.team != team:
        raise _unprocessable("team", f"you belong to team {team!r}, not {spec.team!r}")
    if (
        folder := resolve_dir(settings.data_dir, spec.checkpoint.dir, spec.working_dir)
    ) is not None:
        roots = checkpoint_roots_of(session, caller.team_id)
        if root_holding(folder, roots) is None:  # another team's folder, or the service's own
            raise _unprocessable("checkpoint.dir", outside_roots(folder, team, roots))
    gpus = spec.resources.nodes * spec.resources.gpus_per_node
    borrowing = settings.scheduling.borrowing
    if why := refusal(caller, profile.name, gpus, cap, borrowing):
        raise _unprocessable("resources", why)
    try:
        with ADVISOR_SECONDS.labels("/v1/jobs").time():
            advice = advise_once(spec, profile)
    except (NoPlanFits, ClusterTooSmall) as exc:
        raise _unprocessable("resources", str(exc)) from exc
    except BadOverrides as exc:  # e.g. zero.overrides that break the batch identity
        raise _unprocessable("zero.overrides", str(exc)) from exc
    waiting = decide_submitted(
        session,
        caller,
        profile.name,
        gpus,
        spec.priority,
        cap=cap,
        borrowing=borrowing,
    )
    try:
        stored = job_store.store_job(
            session,
            spec=spec,
            plan=advice.plan.model_dump(mode="json"),
            advice_reason=" ".join([placed, advice.reason, *advice.warnings]).strip(),
            caller=caller,
            backend=profile.kind,
            cluster=profile.name,
            idempotency_key=idempotency_key,
            admitted=waiting is None,
            waiting=WAITING_PREFIX + waiting if waiting else "",
        )
    except job_store.IdempotencyConflict as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from exc
    if isinstance(stored, Job):  # an Idempotency-Key replay: the stored job, as it is now
        return _json(_detail(session, stored, team), status.HTTP_200_OK)
    answer = {**stored.job, "team": team}
    session.commit()
    if waiting is None:
        _enqueue(settings, LAUNCH_ATTEMPT, stored.attempt["id"])
    detail = JobDetail.model_validate(  # from the rows as written: nothing to read back
        {
            **answer,
            "attempts": [stored.attempt],
            "events": stored.events,
            "metrics": [],
            "checkpoints": [],
        }
    )
    return _json(detail, status.HTTP_201_CREATED)


def _json(detail: JobDetail, status_code: int) -> Response:
    """Serialized once, here: returned as a model, FastAPI would dump, validate and serialize
    it again, in a thread-pool hop of its own (on the submit's hot path)."""
    return Response(detail.model_dump_json(), status_code, media_type="application/json")


# What a listing shows (JobPublic) and reads: the team's id, not its name; never spec or plan.
LISTED_FIELDS = [name for name in JobPublic.model_fields if name != "team"] + ["team_id"]
# A listing leads to its first job (OpenAPI links: clients and stateful fuzzers follow them).
FIRST_JOB = {"job_id": "$response.body#/data/0/id"}
LIST_LINKS = {
    name: {"operationRef": f"#/paths/~1v1~1jobs~1{{job_id}}{suffix}", "parameters": FIRST_JOB}
    for name, suffix in [
        ("GetJob", "/get"),
        ("CancelJob", "~1cancel/post"),
        ("JobLogs", "~1logs/get"),
        ("JobMetrics", "~1metrics/get"),
        ("JobCheckpoints", "~1checkpoints/get"),
    ]
}


@router.get(
    "",
    response_model=JobsPublic,
    responses=error_responses(403, 404) | {200: {"description": "Jobs", "links": LIST_LINKS}},
)
def list_jobs(
    user: CurrentUser,
    session: SessionDep,
    status_filter: Annotated[JobStatus | None, Query(alias="status")] = None,
    team: Annotated[str | None, Query(description="admins only: another team's jobs")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
) -> JobsPublic:
    """The caller's team's jobs, newest first."""
    team_id = _team_filter(session, user, team)
    rows, count = job_store.list_job_fields(
        session, LISTED_FIELDS, team_id, status_filter, limit, offset
    )
    names = _team_names(session)
    data = [JobPublic.model_validate({**row, "team": names[row["team_id"]]}) for row in rows]
    return JobsPublic(data=data, count=count)


@router.get("/{job_id}", response_model=JobDetail, responses=error_responses(404))
def get_job(job_id: str, user: CurrentUser, session: SessionDep) -> JobDetail:
    job = _visible_job(session, user, job_id)
    return _detail(session, job, _team_names(session)[job.team_id])


@router.post("/{job_id}/cancel", response_model=JobPublic, responses=error_responses(403, 404, 409))
def cancel_job(
    job_id: str, user: WriterUser, session: SessionDep, settings: SettingsDep
) -> JobPublic:
    """Mark the job cancelled; a worker then stops its processes on the cluster."""
    job = _visible_job(session, user, job_id)
    if JobStatus(job.status).terminal:
        raise HTTPException(
            status.HTTP_409_CONFLICT, detail=f"job {job.id} already ended as {job.status}"
        )
    moved = move_job(
        session, job, JobStatus.active(), JobStatus.CANCELLED, f"cancelled by {user.name}"
    )
    session.commit()
    if moved and (attempt := job_store.current_attempt(session, job)) is not None:
        _enqueue(settings, CANCEL_ATTEMPT, attempt.id)
    return _public(job, _team_names(session)[job.team_id])


@router.get("/{job_id}/logs", response_model=LogsPublic, responses=error_responses(404, 409))
def job_logs(
    job_id: str,
    user: CurrentUser,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
    attempt: Annotated[int | None, Query(ge=1, le=INT32_MAX)] = None,
    tail: Annotated[int, Query(ge=1, le=10000)] = 200,
    offset: Annotated[
        int | None, Query(ge=0, le=INT64_MAX, description="follow: bytes already read")
    ] = None,
) -> LogsPublic:
    """The tail of an attempt's log, or (with ``offset``) what was appended since."""
    job = _visible_job(session, user, job_id)
    number = attempt or job.current_attempt
    row = next((a for a in job_store.attempts_of(session, job.id) if a.number == number), None)
    if row is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, detail=f"job {job.id} has no attempt {number}"
        )
    if not row.log_path:
        launched = row.backend_ref is not None
        return LogsPublic(
            attempt=number, text=_why_no_log(settings, job.cluster) if launched else ""
        )
    root, path = settings.attempts_dir, Path(row.log_path)
    try:
        if offset is None:  # the tail, and where a follower should continue from
            response.headers["X-Next-Offset"] = str(log_size(root, path))
            return LogsPublic(attempt=number, text=tail_lines(root, path, tail))
        text, next_offset = read_from(root, path, offset)
    except NotContained as exc:  # the job swapped its log for a link: never read through it
        raise HTTPException(
            status.HTTP_409_CONFLICT, detail=f"attempt {number}'s log is not readable: {exc}"
        ) from exc
    response.headers["X-Next-Offset"] = str(next_offset)
    return LogsPublic(attempt=number, text=text)


@router.get("/{job_id}/metrics", response_model=list[MetricPublic], responses=error_responses(404))
def job_metrics(
    job_id: str,
    user: CurrentUser,
    session: SessionDep,
    after_id: Annotated[
        int, Query(ge=0, le=INT32_MAX, description="only points newer than this id")
    ] = 0,
    limit: Annotated[
        int, Query(ge=1, le=DETAIL_ROWS, description="at most this many, oldest first")
    ] = DETAIL_ROWS,
) -> list[MetricPublic]:
    """A job's metric points in order; page with ``after_id`` = the last id received."""
    job = _visible_job(session, user, job_id)
    query = select(MetricPoint).where(MetricPoint.job_id == job.id, col(MetricPoint.id) > after_id)
    points = session.exec(query.order_by(col(MetricPoint.id)).limit(limit)).all()
    return [MetricPublic.model_validate(p) for p in points]


@router.get("/{job_id}/wait", response_model=ProgressPublic, responses=error_responses(404))
async def wait_for_job(
    job_id: str,
    request: Request,
    user: CurrentUser,
    session: SessionDep,
    settings: SettingsDep,
    seen_status: Annotated[
        JobStatus | None, Query(alias="status", description="the status last seen")
    ] = None,
    events_after: Annotated[
        int, Query(ge=0, le=INT32_MAX, description="the id of the newest event seen")
    ] = 0,
    metrics_after: Annotated[
        int, Query(ge=0, le=INT32_MAX, description="the id of the newest metric point seen")
    ] = 0,
    timeout_s: Annotated[
        float, Query(ge=1, le=WAIT_MAX_S, description="answer unchanged after this long")
    ] = WAIT_MAX_S,
) -> ProgressPublic:
    """Held until the job moves past what the caller has seen (a new status or event at once,
    new metrics within a second) or until ``timeout_s``, then where it stands. A job that has
    ended answers at once."""
    await run_in_threadpool(_visible_then_released, session, user, job_id)
    hub: ProgressHub = request.app.state.progress_hub
    seen = Seen(seen_status, events_after, metrics_after)
    # Answered inside the request deadline (the middleware would cut a longer hold with 504).
    timeout = min(timeout_s, settings.api.request_deadline_s * WAIT_SHARE_OF_DEADLINE)
    try:
        changed, progress = await hub.wait(job_id, seen, timeout)
    except NoSuchJob as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"job {job_id} not found") from exc
    except ShuttingDown as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            detail="the API is stopping; ask again",
            headers={"Retry-After": "1"},
        ) from exc
    return ProgressPublic(
        changed=changed,
        status=progress.status,
        last_event_id=progress.last_event_id,
        last_metric_id=progress.last_metric_id,
    )


def _visible_then_released(session: Session, user: User, job_id: str) -> None:
    """404 unless the caller may see the job; then the session's connection goes back to the
    pool, so a held request holds none (the hub reads for every waiter at once)."""
    try:
        _visible_job(session, user, job_id)
    finally:
        session.close()


@router.get(
    "/{job_id}/checkpoints",
    response_model=list[CheckpointPublic],
    responses=error_responses(404),
)
def job_checkpoints(
    job_id: str,
    user: CurrentUser,
    session: SessionDep,
    after_id: Annotated[
        int, Query(ge=0, le=INT32_MAX, description="only checkpoints newer than this id")
    ] = 0,
    limit: Annotated[
        int, Query(ge=1, le=DETAIL_ROWS, description="at most this many, oldest first")
    ] = DETAIL_ROWS,
) -> list[CheckpointPublic]:
    """A job's reported checkpoints in order; page with ``after_id`` = the last id received."""
    job = _visible_job(session, user, job_id)
    query = select(Checkpoint).where(Checkpoint.job_id == job.id, col(Checkpoint.id) > after_id)
    rows = session.exec(query.order_by(col(Checkpoint.id)).limit(limit)).all()
    return [CheckpointPublic.model_validate(c) for c in rows]


def _unprocessable(field: str, message: str) -> HTTPException:
    detail = [{"loc": ["body", *field.split(".")], "msg": message, "type": "value_error"}]
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=detail)


def _profile_for(settings: Settings, spec: JobSpec) -> ClusterProfile:
    profiles = settings.cluster_profiles()
    profile = profiles.get(spec.resources.cluster)
    if profile is None:
        known = ", ".join(sorted(profiles))
        raise _unprocessable(
            "resources.cluster", f"unknown cluster {spec.resources.cluster!r}; known: {known}"
        )
    if spec.resources.nodes > profile.max_nodes:
        raise _unprocessable(
            "resources.nodes",
            f"cluster {profile.name!r} offers at most {profile.max_nodes} nodes, "
            f"the job asks for {spec.resources.nodes}",
        )
    if profile.kind == BackendKind.KUBERNETES and spec.image is None:  # else a LAUNCH_ERROR later
        raise _unprocessable(
            "image", f"cluster {profile.name!r} runs each node in a container: set the job's image"
        )
    return profile


def _enqueue(settings: Settings, task: str, attempt_id: str) -> None:
    send_or_leave_to_sweep(settings.broker_url, task, attempt_id)


def _team_names(session: Session) -> dict[int, str]:
    return {t.id: t.name for t in session.exec(select(Team)).all() if t.id is not None}


def _team_filter(session: Session, user: User, team: str | None) -> int | None:
    if team is None:
        return user.team_id
    if not user.is_admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="only admins may list other teams")
    row = session.exec(select(Team).where(Team.name == team)).first()
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"team {team!r} not found")
    return row.id


def _why_no_log(settings: Settings, cluster: str) -> str:
    """Why a launched attempt has no log file the API can read (none on Kubernetes without
    the shared volume; the others always have one)."""
    profile = settings.cluster_profiles().get(cluster)
    if profile is None or profile.kind != BackendKind.KUBERNETES:
        return ""
    if profile.shared_volume_claim is None:
        return (
            f"(no log here: the pods of cluster {cluster} mount no shared volume (its profile's "
            "shared_volume_claim), so their output stays with the pods: read it with kubectl "
            "logs)"
        )
    return (
        f"(no log here: the attempt folders are not under {profile.shared_volume_path}, where "
        f"the pods of cluster {cluster} mount the shared volume, so they could not write it)"
    )


def _visible_job(session: Session, user: User, job_id: str) -> Job:
    # Another team's job is "not found", not "forbidden": its existence is not disclosed.
    job = job_store.get_job(session, job_id, None if user.is_admin else user.team_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"job {job_id} not found")
    return job


def _fields(job: Job) -> dict[str, object]:
    # getattr, not model_dump: it reloads attributes that a commit expired.
    return {name: getattr(job, name) for name in Job.model_fields}


def _public(job: Job, team: str) -> JobPublic:
    return JobPublic.model_validate({**_fields(job), "team": team})


Row = TypeVar("Row", JobEvent, MetricPoint, Checkpoint)


def _latest(session: Session, table: type[Row], job_id: str) -> list[Row]:
    query = select(table).where(table.job_id == job_id).order_by(col(table.id).desc())
    return list(reversed(session.exec(query.limit(DETAIL_ROWS)).all()))


def _detail(session: Session, job: Job, team: str) -> JobDetail:
    return JobDetail.model_validate(
        {
            **_fields(job),
            "team": team,
            "attempts": [
                AttemptPublic.model_validate(a) for a in job_store.attempts_of(session, job.id)
            ],
            "events": [EventPublic.model_validate(e) for e in _latest(session, JobEvent, job.id)],
            "metrics": [
                MetricPublic.model_validate(m) for m in _latest(session, MetricPoint, job.id)
            ],
            "checkpoints": [
                CheckpointPublic.model_validate(c) for c in _latest(session, Checkpoint, job.id)
            ],
            "checkpoint_bytes": job_store.checkpoint_bytes(session, job.id),
        }
    )
