"""Each cluster's calibration: refit from its stored observations, read by every plan made there.

``refit`` runs the pure ``fit`` over the cluster's usable observations (the latest ``FIT_AT_MOST``
since its last reset, on its accelerator of today) and stores the multipliers and the memory
shares. ``current`` is what submits, placement and advice read: the stored row, kept in this
process for ``REFRESH_S`` so a submit costs no extra query. Frozen: observations are still
recorded, the constants do not move. Reset: back to the advisor's constants, and the
observations before it are not learnt from again.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime

from sqlalchemy import ColumnElement
from sqlmodel import Session, col, func, select

from service.core.advisor.calibration import ClusterCalibration, Observation, fit, restored
from service.core.advisor.calibration_memory import MemoryCorrection, PeakKind
from service.core.advisor.constants import CALIBRATION
from service.core.advisor.models import Candidate
from service.core.clusters import ClusterProfile
from service.core.observing import observation_of, refit_due
from service.core.spec import JobSpec
from service.db.models import AttemptObservation, ClusterCalibrationRow, as_utc, utcnow

FIT_AT_MOST = 200  # the latest observations a fit reads: a cluster's recent truth, a bounded fit
REFRESH_S = 5.0  # how stale a process's copy of a cluster's calibration may be
_cache: dict[str, tuple[float, ClusterCalibration]] = {}
_lock = threading.Lock()


def current(session: Session, cluster: str) -> ClusterCalibration:
    """The cluster's calibration as plans use it (the advisor's constants when none is stored)."""
    now = time.monotonic()
    with _lock:
        kept = _cache.get(cluster)
    if kept is not None and now - kept[0] < REFRESH_S:
        return kept[1]
    calibration = calibration_of(session.get(ClusterCalibrationRow, cluster))
    with _lock:
        _cache[cluster] = (now, calibration)
    return calibration


def forget() -> None:
    """Drop this process's copies: the next read is the stored row."""
    with _lock:
        _cache.clear()


def calibration_of(row: ClusterCalibrationRow | None) -> ClusterCalibration:
    if row is None or not row.observations:
        return ClusterCalibration(constants=CALIBRATION)
    memory = MemoryCorrection(row.gpu_share, row.cpu_share, reason=row.memory_reason)
    return restored(
        row.multipliers, memory, row.observations, row.typical_error,
        source=row.imported_from or "",
    )  # fmt: skip


def row_of(session: Session, cluster: str) -> ClusterCalibrationRow:
    return session.get(ClusterCalibrationRow, cluster) or ClusterCalibrationRow(cluster=cluster)


def _usable(cluster: str, accelerator: str, since: datetime | None) -> list[ColumnElement[bool]]:
    where = [
        col(AttemptObservation.cluster) == cluster,
        col(AttemptObservation.accelerator) == accelerator,
        col(AttemptObservation.step_seconds).is_not(None),
    ]
    if since is not None:
        where.append(col(AttemptObservation.created_at) >= since)
    return where


def new_observations(session: Session, profile: ClusterProfile, row: ClusterCalibrationRow) -> int:
    """Usable observations since the last fit (or reset)."""
    since = max((as_utc(t) for t in (row.fitted_at, row.learn_since) if t), default=None)
    query = select(func.count()).select_from(AttemptObservation)
    query = query.where(*_usable(profile.name, profile.accelerator, since))
    return int(session.exec(query).one())


def refit_if_due(session: Session, profile: ClusterProfile, after: int) -> bool:
    row = row_of(session, profile.name)
    if row.frozen:
        return False
    fitted = as_utc(row.fitted_at) if row.fitted_at else None
    if not refit_due(new_observations(session, profile, row), after, fitted, utcnow()):
        return False
    refit(session, profile, row)
    return True


def refit(session: Session, profile: ClusterProfile, row: ClusterCalibrationRow) -> None:
    """Fit the cluster's usable observations and store the result on ``row``."""
    stored = latest_usable(session, profile, row, FIT_AT_MOST)
    fitted = fit([rebuilt(o, profile) for o in reversed(stored)])
    row.multipliers = {k: round(v, 6) for k, v in fitted.multipliers.items()}
    row.gpu_share, row.cpu_share = fitted.memory.gpu_share, fitted.memory.cpu_share
    row.memory_reason = fitted.memory.reason
    row.observations, row.typical_error = fitted.observations, fitted.typical_error
    row.fitted_at = row.updated_at = utcnow()
    row.imported_from = None  # its own runs from here on
    session.add(row)


def latest_usable(
    session: Session, profile: ClusterProfile, row: ClusterCalibrationRow, limit: int
) -> list[AttemptObservation]:
    """The latest observations a fit reads (since the last reset), newest first."""
    since = as_utc(row.learn_since) if row.learn_since else None
    query = (
        select(AttemptObservation)
        .where(*_usable(profile.name, profile.accelerator, since))
        .order_by(col(AttemptObservation.created_at).desc())
        .limit(limit)
    )
    return list(session.exec(query).all())


def rebuilt(o: AttemptObservation, profile: ClusterProfile) -> Observation:
    """The advisor's view of a stored observation, on its cluster as configured today."""
    assert o.step_seconds is not None
    kind: PeakKind = o.peak_kind  # type: ignore[assignment]
    return observation_of(
        o.attempt_id, JobSpec.model_validate(o.spec), Candidate.model_validate(o.plan), profile,
        o.step_seconds, neighbours=o.neighbours, peak_bytes=o.peak_bytes, kind=kind,
    )  # fmt: skip


def set_frozen(session: Session, cluster: str, frozen: bool) -> ClusterCalibrationRow:
    row = row_of(session, cluster)
    row.frozen, row.updated_at = frozen, utcnow()
    session.add(row)
    return row


def reset(session: Session, cluster: str) -> ClusterCalibrationRow:
    """Back to the advisor's constants; only observations from now on are learnt from."""
    row = row_of(session, cluster)
    row.multipliers, row.gpu_share, row.cpu_share, row.memory_reason = {}, 0.0, 0.0, ""
    row.observations, row.typical_error, row.fitted_at = 0, 0.0, None
    row.learn_since = row.updated_at = utcnow()
    row.imported_from = None
    session.add(row)
    return row


def import_from(session: Session, cluster: str, source: ClusterCalibrationRow) -> None:
    """Another cluster's constants (``source``, as exported) until this one's own runs refit:
    a new cluster of the same hardware starts from them. What it learnt before is forgotten."""
    row = row_of(session, cluster)
    row.multipliers = dict(source.multipliers)
    row.gpu_share, row.cpu_share = source.gpu_share, source.cpu_share
    row.memory_reason = f"imported from cluster {source.cluster}: {source.memory_reason}"
    row.observations, row.typical_error = source.observations, source.typical_error
    row.imported_from = source.cluster
    row.fitted_at = row.learn_since = row.updated_at = utcnow()
    session.add(row)
