"""A cluster's calibration: what the advisor learnt there, and the operator's control over it
(freeze, unfreeze, reset; admins only). Reading it is open to every user: plans quote it."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status
from sqlmodel import Session, col, select

from service.api.deps import AdminUser, CurrentUser, SessionDep, SettingsDep
from service.api.errors import error_responses
from service.api.schemas import (
    CalibrationImport,
    CalibrationPublic,
    CalibrationUpdate,
    ObservationPublic,
)
from service.db import calibrations
from service.db.models import AttemptObservation, ClusterCalibrationRow
from service.settings import Settings

RECENT = 20  # observations shown with a calibration
router = APIRouter(prefix="/v1/clusters", tags=["calibration"], responses=error_responses(401, 404))


@router.get("/{cluster}/calibration", response_model=CalibrationPublic)
def show_calibration(
    cluster: str, _user: CurrentUser, session: SessionDep, settings: SettingsDep
) -> CalibrationPublic:
    """The cluster's fitted constants, its state and its latest observations."""
    _known(settings, cluster)
    return _public(session, calibrations.row_of(session, cluster))


@router.patch("/{cluster}/calibration", response_model=CalibrationPublic,
              responses=error_responses(403))  # fmt: skip
def freeze_calibration(
    cluster: str,
    body: CalibrationUpdate,
    _admin: AdminUser,
    session: SessionDep,
    settings: SettingsDep,
) -> CalibrationPublic:
    """Freeze (observations are still recorded, the constants stay) or unfreeze."""
    _known(settings, cluster)
    row = calibrations.set_frozen(session, cluster, body.frozen)
    session.commit()
    return _public(session, row)


@router.delete("/{cluster}/calibration", response_model=CalibrationPublic,
               responses=error_responses(403))  # fmt: skip
def reset_calibration(
    cluster: str, _admin: AdminUser, session: SessionDep, settings: SettingsDep
) -> CalibrationPublic:
    """Back to the advisor's constants; only attempts ending from now on are learnt from."""
    _known(settings, cluster)
    row = calibrations.reset(session, cluster)
    session.commit()
    calibrations.forget()  # this process plans with it at once; others within a few seconds
    return _public(session, row)


@router.put("/{cluster}/calibration", response_model=CalibrationPublic,
            responses=error_responses(403))  # fmt: skip
def import_calibration(
    cluster: str,
    body: CalibrationImport,
    _admin: AdminUser,
    session: SessionDep,
    settings: SettingsDep,
) -> CalibrationPublic:
    """Start from another cluster's constants (an export) until this one's own runs refit."""
    _known(settings, cluster)
    source = ClusterCalibrationRow(
        cluster=body.cluster, multipliers=body.multipliers, gpu_share=body.gpu_memory_share,
        cpu_share=body.cpu_memory_share, observations=body.observations,
        typical_error=body.typical_error, memory_reason=body.memory_reason,
    )  # fmt: skip
    calibrations.import_from(session, cluster, source)
    session.commit()
    calibrations.forget()
    return _public(session, calibrations.row_of(session, cluster))


def _known(settings: Settings, cluster: str) -> None:
    if cluster not in settings.cluster_profiles():
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no cluster {cluster!r}")


def _public(session: Session, row: ClusterCalibrationRow) -> CalibrationPublic:
    query = (
        select(AttemptObservation)
        .where(AttemptObservation.cluster == row.cluster)
        .order_by(col(AttemptObservation.created_at).desc())
        .limit(RECENT)
    )
    recent = [
        ObservationPublic.model_validate(o, from_attributes=True) for o in session.exec(query)
    ]
    return CalibrationPublic(
        cluster=row.cluster, observations=row.observations, typical_error=row.typical_error,
        multipliers=row.multipliers, gpu_memory_share=row.gpu_share,
        cpu_memory_share=row.cpu_share, memory_reason=row.memory_reason, frozen=row.frozen,
        fitted_at=row.fitted_at, learn_since=row.learn_since, imported_from=row.imported_from,
        recent=recent,
    )  # fmt: skip
