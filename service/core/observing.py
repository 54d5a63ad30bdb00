"""What one ended attempt teaches the advisor: its steady step time, its peak, its neighbours.

The rule: an attempt that SUCCEEDED or was stopped (cancelled, preempted) is learnt from when it
reported at least ``WARMUP_STEPS + STEADY_STEPS`` steps with a pace; the first ``WARMUP_STEPS``
(optimizer states, kernels, the allocator growing) are left out and the median of the rest is
its step time. A failed attempt is not: its last steps may be what failed. The service stores
the verdict either way, so each attempt is looked at once. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from service.core.advisor.calibration import (
    STEADY_STEPS,
    WARMUP_STEPS,
    Observation,
    steady_step_seconds,
)
from service.core.advisor.calibration_memory import PeakKind
from service.core.advisor.candidates import knobs_of, layout_of
from service.core.advisor.layout import model_sized_knobs
from service.core.advisor.models import Candidate
from service.core.advisor.workload import build_workload
from service.core.clusters import ClusterProfile
from service.core.spec import JobSpec
from service.core.states import AttemptStatus

LEARNT_FROM = frozenset({AttemptStatus.SUCCEEDED, AttemptStatus.CANCELLED, AttemptStatus.PREEMPTED})


@dataclass(frozen=True)
class Measured:
    """The steady part of an attempt's reports: ``step_seconds`` None when it was too short."""

    step_seconds: float | None
    steady_steps: int
    skipped: str  # "" when learnt from


def measure(status: AttemptStatus, spec: JobSpec, paces: Sequence[float | None]) -> Measured:
    """The steady step time from the tokens/s of each reported step, in step order."""
    steps = [s for p in paces if (s := spec.training.step_seconds(p)) is not None]
    steady = max(0, len(steps) - WARMUP_STEPS)
    if status not in LEARNT_FROM:
        return Measured(None, steady, f"a {status} attempt is not learnt from")
    median = steady_step_seconds(steps)
    if median is None:
        needed = WARMUP_STEPS + STEADY_STEPS
        return Measured(None, steady, f"{len(steps)} steps with a pace reported, {needed} needed")
    return Measured(median, steady, "")


def peak_kind(on_cpu: bool, reserved: bool) -> PeakKind:
    """On CPU ranks the runtime's peak is the resident high-water mark; on a GPU torch's
    allocated peak, or the reserved one where the training reports it."""
    if on_cpu:
        return "resident"
    return "reserved" if reserved else "allocated"


def observation_of(
    key: str,
    spec: JobSpec,
    plan: Candidate,
    profile: ClusterProfile,
    step_seconds: float,
    *,
    neighbours: int = 0,
    peak_bytes: int | None = None,
    kind: PeakKind = "allocated",
) -> Observation:
    """The advisor's view of a stored attempt, rebuilt from its spec and plan on its cluster."""
    work = build_workload(spec, profile)
    fallback = model_sized_knobs(work.shape.parameters, plan.zero_stage)
    return Observation(
        key=key,
        work=work,
        layout=layout_of(plan, knobs_of(plan, fallback)),
        step_seconds=step_seconds,
        neighbours=neighbours,
        peak_bytes=peak_bytes,
        peak_kind=kind,
        predicted_step_seconds=plan.step_seconds,
        predicted_peak_bytes=plan.per_gpu_bytes.total,
    )


REFIT_AT_LEAST_EVERY = timedelta(days=1)  # fewer than N new in a day still count, a day later


def refit_due(new: int, after: int, fitted_at: datetime | None, now: datetime) -> bool:
    """Refit after ``after`` new observations, or a day after the last fit with any new one;
    the first fit waits for ``after`` runs."""
    if new >= after:
        return True
    return new > 0 and fitted_at is not None and now - fitted_at >= REFIT_AT_LEAST_EVERY
