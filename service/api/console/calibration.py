"""The console's scatter of the advisor's predictions against what runs measured, per cluster
(docs/advisor.md): for each observed run its step time and memory peak, measured, predicted by
the cluster's calibrated constants today, and as its plan said when it was made.

Open to every user, like the calibration it shows: a run is named by its attempt and plan,
never by its job's name. A run newer than the fit is one the constants have not learnt from.
"""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, ValidationError
from sqlmodel import Session

from service.api.deps import CurrentUser, SessionDep, SettingsDep
from service.core.advisor.against_measured import against_measured
from service.core.advisor.calibration import ClusterCalibration
from service.core.advisor.models import Candidate
from service.core.clusters import ClusterProfile
from service.db import calibrations
from service.db.models import AttemptObservation, ClusterCalibrationRow, as_utc

router = APIRouter(prefix="/console/api", tags=["console"], include_in_schema=False)
SHOWN = 100  # the latest runs per cluster: a readable scatter, a bounded request


class RunPoint(BaseModel):
    attempt_id: str
    job_id: str
    plan: str  # e.g. "ZeRO-2 mb=4x2"
    observed_at: datetime
    learnt: bool  # the stored fit has seen this run (False: newer than the fit)
    neighbours: int  # other attempts on its device while it ran
    measured_step_s: float
    predicted_step_s: float  # calibrated
    planned_step_s: float | None
    step_error: float  # predicted / measured - 1
    planned_step_error: float | None
    peak_kind: str
    measured_peak_bytes: int | None
    predicted_peak_bytes: int
    planned_peak_bytes: int | None
    peak_error: float | None


class ClusterScatter(BaseModel):
    cluster: str
    accelerator: str
    observations: int  # runs the stored fit rests on; 0: the advisor's own constants
    typical_error: float
    frozen: bool
    imported_from: str | None
    memory_reason: str
    fitted_at: datetime | None
    runs: list[RunPoint]  # newest first


@router.get("/calibration", response_model=list[ClusterScatter])
def calibration_scatter(
    _user: CurrentUser, session: SessionDep, settings: SettingsDep
) -> list[ClusterScatter]:
    """Every configured cluster, with its latest observed runs."""
    return [_cluster(session, p) for p in settings.cluster_profiles().values()]


def _cluster(session: Session, profile: ClusterProfile) -> ClusterScatter:
    row = calibrations.row_of(session, profile.name)
    calibration = calibrations.calibration_of(row)
    stored = calibrations.latest_usable(session, profile, row, SHOWN)
    runs = [p for o in stored if (p := _point(o, profile, calibration, row)) is not None]
    return ClusterScatter(
        cluster=profile.name, accelerator=profile.accelerator, observations=row.observations,
        typical_error=row.typical_error, frozen=row.frozen, imported_from=row.imported_from,
        memory_reason=row.memory_reason, fitted_at=row.fitted_at, runs=runs,
    )  # fmt: skip


def _point(
    o: AttemptObservation,
    profile: ClusterProfile,
    calibration: ClusterCalibration,
    row: ClusterCalibrationRow,
) -> RunPoint | None:
    try:
        run = calibrations.rebuilt(o, profile)
        plan = Candidate.model_validate(o.plan).label()
    except (ValidationError, ValueError):  # stored before today's schema: nothing to redraw
        return None
    seen = against_measured(run, calibration)
    fitted = as_utc(row.fitted_at) if row.fitted_at else None
    return RunPoint(
        attempt_id=o.attempt_id, job_id=o.job_id, plan=plan, observed_at=o.created_at,
        learnt=fitted is not None and as_utc(o.created_at) <= fitted, neighbours=o.neighbours,
        measured_step_s=seen.measured_step_s, predicted_step_s=seen.predicted_step_s,
        planned_step_s=seen.planned_step_s, step_error=seen.step_error,
        planned_step_error=seen.planned_step_error, peak_kind=o.peak_kind,
        measured_peak_bytes=seen.measured_peak_bytes,
        predicted_peak_bytes=seen.predicted_peak_bytes,
        planned_peak_bytes=seen.planned_peak_bytes, peak_error=seen.peak_error,
    )  # fmt: skip
