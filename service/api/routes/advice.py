"""Advice routes: plan a job's memory without submitting it, and lint a user's own ds_config.

These routes only compute; they store nothing and touch no cluster. They know the cluster
profiles through the ``cluster_profiles`` dependency: the application's
``app.state.cluster_profiles`` (set by ``create_app``), else only ``local``. Not
``app.dependency_overrides``: while that mapping is not empty, FastAPI rebuilds every route's
dependency tree on every request. Only ``cluster: auto`` reads the database: it places the job
through the submit's own entry (``service.db.placing``), so advice never names a cluster whose
cap the job is over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, HTTPException, Query, Request, status
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError
from sqlmodel import Session

from service.core.advisor import BadOverrides, Candidate, ClusterTooSmall, NoPlanFits, advise
from service.core.advisor.calibration import ClusterCalibration
from service.core.advisor.lint import Finding, has_errors, lint_ds_config
from service.core.clusters import LOCAL_PROFILE, ClusterProfile
from service.core.limits import plain_document
from service.core.placement import AUTO
from service.core.spec import JobSpec
from service.db.calibrations import current as current_calibration
from service.db.placing import place
from service.db.session import get_engine
from service.metrics import ADVISOR_SECONDS
from service.settings import Settings

router = APIRouter(prefix="/v1/advice", tags=["advice"])

PolicyName = Literal["throughput", "capacity"]
# A body with only the model/training/resources parts still gets advice: these fill the rest.
PLACEHOLDERS = {"name": "advice", "entrypoint": "train.py"}


async def cluster_profiles(request: Request) -> dict[str, ClusterProfile]:
    """The known cluster profiles by name."""
    configured: Callable[[], dict[str, ClusterProfile]] | None = getattr(
        request.app.state, "cluster_profiles", None
    )
    return configured() if configured else {LOCAL_PROFILE.name: LOCAL_PROFILE}


ProfilesDep = Annotated[dict[str, ClusterProfile], Depends(cluster_profiles)]


class AdvicePublic(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: Candidate
    candidates: list[Candidate]
    warnings: list[str]
    reason: str


class LintRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # the lint rules walk it: no deeper than 32, finite numbers
    ds_config: Annotated[dict[str, Any], AfterValidator(plain_document)]
    job: dict[str, Any] | None = None


class LintPublic(BaseModel):
    findings: list[Finding]
    has_errors: bool


@router.post("", response_model=AdvicePublic)
def advise_job(
    body: Annotated[
        dict[str, Any],
        Body(
            examples=[
                {
                    "model": {"parameters": 7_000_000_000},
                    "training": {"sequence_length": 4096, "global_batch_size": 256},
                }
            ]
        ),
    ],
    profiles: ProfilesDep,
    request: Request,
    policy: Annotated[PolicyName | None, Query()] = None,
) -> AdvicePublic:
    """Every candidate configuration for the job, the chosen plan and why; nothing is stored."""
    chosen = _policy(body.pop("policy", None), policy)
    spec = parse_job(body)
    if spec.resources.cluster == AUTO:
        return _placed_advice(spec, profiles, chosen, request.app.state.settings)
    profile = profile_for(spec, profiles)
    calibration = _calibration_of(request, profile.name)
    try:
        with ADVISOR_SECONDS.labels("/v1/advice").time():
            advice = advise(spec, profile, chosen, calibration=calibration)
    except NoPlanFits as exc:
        raise _no_plan(exc) from exc
    except BadOverrides as exc:
        raise unprocessable(["body", "zero", "overrides"], str(exc)) from exc
    except ClusterTooSmall as exc:
        raise unprocessable(["body", "resources"], str(exc)) from exc
    return AdvicePublic(
        plan=advice.plan,
        candidates=advice.candidates,
        warnings=advice.warnings,
        reason=advice.reason,
    )


@router.post("/lint", response_model=LintPublic)
def lint_config(request: LintRequest, profiles: ProfilesDep) -> LintPublic:
    """Findings for a ds_config; with ``job`` also whether it fits and what would run faster."""
    spec = parse_job(request.job, loc="job") if request.job is not None else None
    profile = profile_for(spec, profiles) if spec is not None else None
    findings = lint_ds_config(request.ds_config, spec, profile)
    return LintPublic(findings=findings, has_errors=has_errors(findings))


def _placed_advice(
    spec: JobSpec, profiles: dict[str, ClusterProfile], policy: PolicyName, settings: Settings
) -> AdvicePublic:
    """``cluster: auto``: the plan of the cluster placement would choose were every cluster
    free (a submit also weighs where it would start now), the others in the reason."""
    engine = get_engine(settings.database_url)
    with Session(engine) as session, ADVISOR_SECONDS.labels("/v1/advice").time():
        placed = place(session, spec, profiles, None, plan=lambda s, p: advise(
            s, p, policy, calibration=current_calibration(session, p.name)))  # fmt: skip
    best = placed.chosen
    if best is None or best.advice is None:
        why = placed.ruled_out() or "none configured"
        raise unprocessable(["body", "resources", "cluster"], f"no cluster can run it ({why})")
    advice = best.advice
    reason = f"{placed.summary()}. {advice.reason}"
    return AdvicePublic(
        plan=advice.plan, candidates=advice.candidates, warnings=advice.warnings, reason=reason
    )


def parse_job(body: dict[str, Any], loc: str | None = None) -> JobSpec:
    """A JobSpec from a full spec or only its model/training/resources/zero parts."""
    try:
        return JobSpec.model_validate({**PLACEHOLDERS, **body})
    except ValidationError as exc:
        prefix = ("body", loc) if loc else ("body",)
        errors = [{**e, "loc": (*prefix, *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from exc


def profile_for(spec: JobSpec, profiles: dict[str, ClusterProfile]) -> ClusterProfile:
    profile = profiles.get(spec.resources.cluster)
    if profile is None:
        known = ", ".join(sorted(profiles))
        raise unprocessable(
            ["body", "resources", "cluster"],
            f"unknown cluster {spec.resources.cluster!r}; known: {known}",
        )
    return profile


def _policy(from_body: Any, from_query: PolicyName | None) -> PolicyName:
    value = from_query or from_body or "throughput"
    if value not in ("throughput", "capacity"):
        raise unprocessable(
            ["body", "policy"], f"policy must be throughput or capacity, not {value!r}"
        )
    chosen: PolicyName = value
    return chosen


def unprocessable(loc: list[str], message: str, **extra: Any) -> HTTPException:
    detail = [{"loc": loc, "msg": message, "type": "value_error", **extra}]
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=detail)


def _no_plan(exc: NoPlanFits) -> HTTPException:
    """Nothing fits: say so, with the closest candidate and the overshoot, as data."""
    closest = exc.closest.model_dump(mode="json")
    return unprocessable(
        ["body", "resources"], str(exc), closest=closest, over_by_bytes=exc.over_by_bytes
    )


def _calibration_of(request: Request, cluster: str) -> ClusterCalibration | None:
    """The cluster's stored calibration (kept a few seconds per process: most reads no query);
    None where the app has no database (the router mounted alone plans with today's)."""
    settings: Settings | None = getattr(request.app.state, "settings", None)
    if settings is None:
        return None
    with Session(get_engine(settings.database_url)) as session:
        return current_calibration(session, cluster)
