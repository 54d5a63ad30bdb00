"""Submitting a job: who may, where it goes, its plan, whether it waits, and its rows; its launch
is queued once they are committed.

No HTTP here: refusals are domain errors (``Refused`` names the field, ``Unauthorised``,
``Forbidden``, ``IdempotencyConflict``), which the FastAPI route and the fast path map to status
codes and bodies in one place (``service.api.submitting``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlmodel import Session

from service.checkpoint_paths import outside_roots, resolve_dir, root_holding
from service.core.admission import Cap
from service.core.advisor import Advice, BadOverrides, ClusterTooSmall, NoPlanFits
from service.core.clusters import BackendKind, ClusterProfile
from service.core.placement import AUTO
from service.core.roles import viewer_refusal
from service.core.spec import JobSpec
from service.db import jobs as job_store
from service.db.admission import WAITING_PREFIX, decide_submitted, refusal
from service.db.cluster_bounds import cap_of
from service.db.jobs import IdempotencyConflict
from service.db.models import Job
from service.db.new_job import writes_in_one_statement
from service.db.placing import Planner, calibrated_planner, place
from service.db.session import autocommit, get_engine
from service.db.users import Caller, caller_by_token, checkpoint_roots_of
from service.metrics import ADVISOR_SECONDS
from service.security import MISSING_TOKEN, UNKNOWN_TOKEN
from service.settings import Settings
from service.tasks import LAUNCH_ATTEMPT, send_or_leave_to_sweep

__all__ = ["Forbidden", "IdempotencyConflict", "Refused", "Submitted", "Unauthorised", "submit"]


class Refused(Exception):
    """The job cannot be taken as submitted: the field at fault (dotted) and why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class Unauthorised(Exception):
    """No token, or one that no user holds."""


class Forbidden(Exception):
    """A known user who may not submit (a viewer)."""


@dataclass(frozen=True)
class Submitted:
    record: dict[str, Any]  # the job, its attempts, events, metrics and checkpoints
    created: bool  # False: an Idempotency-Key replay, the stored job as it is now


@dataclass(frozen=True)
class _Target:
    """Where the job goes, and what placement already knows of it there."""

    profile: ClusterProfile
    cap: Cap
    advice: Advice | None = None  # planned by placement (None: not yet)
    placed: str = ""  # the placement in words, for ``cluster: auto``


def submit(
    spec: JobSpec, token: str | None, settings: Settings, idempotency_key: str | None
) -> Submitted:
    """Validate, place, plan and store a job; its launch is queued once the row is committed."""
    engine = get_engine(settings.database_url)
    # Where a new job is one statement (PostgreSQL), atomic on its own, a submit under no limit
    # needs no transaction, and so sends no BEGIN and no COMMIT: two round trips of four (five
    # when the pooled connection sat idle and is pinged first).
    reads = autocommit(engine) if writes_in_one_statement(engine) else engine
    with Session(reads) as session:
        caller = submitter(session, token)
        target = _target(session, caller, spec, settings)
        if reads is engine or (caller.gpu_quota is None and target.cap.gpus is None):
            return _store(session, caller, spec, target, settings, idempotency_key)
    with Session(engine) as session:  # a limit applies: decided and written in one transaction
        return _store(session, caller, spec, target, settings, idempotency_key)


def submitter(session: Session, token: str | None) -> Caller:
    """The token's caller, if they may submit."""
    if token is None:
        raise Unauthorised(MISSING_TOKEN)
    caller = caller_by_token(session, token)
    if caller is None:
        raise Unauthorised(UNKNOWN_TOKEN)
    if not caller.can_write:
        raise Forbidden(viewer_refusal(caller.user_name))
    return caller


def _target(session: Session, caller: Caller, spec: JobSpec, settings: Settings) -> _Target:
    profiles = settings.cluster_profiles()
    if spec.resources.cluster != AUTO:
        profile = _named_profile(profiles, spec)
        return _Target(profile, cap_of(session, profile))
    placed = place(session, spec, profiles, caller, borrowing=settings.scheduling.borrowing,
                   plan=_timed_planner(session))  # fmt: skip
    if (chosen := placed.chosen) is None:
        why = placed.ruled_out() or "none configured"
        raise Refused("resources.cluster", f"no cluster can run this job ({why})")
    profile = profiles[chosen.cluster]
    return _Target(profile, placed.caps[profile.name], chosen.advice, placed.summary())


def _store(
    session: Session,
    caller: Caller,
    spec: JobSpec,
    target: _Target,
    settings: Settings,
    idempotency_key: str | None,
) -> Submitted:
    _check_team_and_folder(session, caller, spec, settings)
    profile, gpus = target.profile, spec.resources.world_size
    borrowing = settings.scheduling.borrowing
    if why := refusal(caller, profile.name, gpus, target.cap, borrowing):
        raise Refused("resources", why)
    advice = target.advice or _advice(session, spec, profile)
    waiting = decide_submitted(
        session, caller, profile.name, gpus, spec.priority, cap=target.cap, borrowing=borrowing
    )
    stored = job_store.store_job(
        session, spec=spec, plan=advice.plan.model_dump(mode="json"),
        advice_reason=" ".join([target.placed, advice.reason, *advice.warnings]).strip(),
        caller=caller, backend=profile.kind, cluster=profile.name,
        idempotency_key=idempotency_key, admitted=waiting is None,
        waiting=WAITING_PREFIX + waiting if waiting else "",
    )  # fmt: skip
    if isinstance(stored, Job):  # an Idempotency-Key replay: the stored job, as it is now
        return Submitted(job_store.job_record(session, stored, caller.team_name), created=False)
    session.commit()
    if waiting is None:
        send_or_leave_to_sweep(settings.broker_url, LAUNCH_ATTEMPT, stored.attempt["id"])
    record = {**stored.job, "team": caller.team_name, "attempts": [stored.attempt],
              "events": stored.events, "metrics": [], "checkpoints": []}  # fmt: skip
    return Submitted(record, created=True)  # from the rows as written: nothing to read back


def _check_team_and_folder(
    session: Session, caller: Caller, spec: JobSpec, settings: Settings
) -> None:
    team = caller.team_name
    if spec.team is not None and spec.team != team:
        raise Refused("team", f"you belong to team {team!r}, not {spec.team!r}")
    folder = resolve_dir(settings.data_dir, spec.checkpoint.dir, spec.working_dir)
    if folder is not None:
        roots = checkpoint_roots_of(session, caller.team_id)
        if root_holding(folder, roots) is None:  # another team's folder, or the service's own
            raise Refused("checkpoint.dir", outside_roots(folder, team, roots))


def _advice(session: Session, spec: JobSpec, profile: ClusterProfile) -> Advice:
    try:
        return _timed_planner(session)(spec, profile)
    except (NoPlanFits, ClusterTooSmall) as exc:
        raise Refused("resources", str(exc)) from exc
    except BadOverrides as exc:  # e.g. zero.overrides that break the batch identity
        raise Refused("zero.overrides", str(exc)) from exc


def _timed_planner(session: Session) -> Planner:
    """Plans with each cluster's stored calibration, timed."""
    planned = calibrated_planner(session)

    def timed(spec: JobSpec, profile: ClusterProfile) -> Advice:
        with ADVISOR_SECONDS.labels("/v1/jobs").time():
            return planned(spec, profile)

    return timed


def _named_profile(profiles: dict[str, ClusterProfile], spec: JobSpec) -> ClusterProfile:
    """The cluster the spec names, if it can take the job's shape."""
    name = spec.resources.cluster
    if (profile := profiles.get(name)) is None:
        known = ", ".join(sorted(profiles))
        raise Refused("resources.cluster", f"unknown cluster {name!r}; known: {known}")
    if spec.resources.nodes > profile.max_nodes:
        raise Refused(
            "resources.nodes",
            f"cluster {name!r} offers at most {profile.max_nodes} nodes, "
            f"the job asks for {spec.resources.nodes}",
        )
    if profile.kind == BackendKind.KUBERNETES and spec.image is None:  # else a LAUNCH_ERROR later
        raise Refused(
            "image", f"cluster {name!r} runs each node in a container: set the job's image"
        )
    return profile
