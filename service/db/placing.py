"""Where a ``cluster: auto`` job can go: the one answer that a submit, the re-placement after a
failed launch, the waiting re-placement and ``/v1/advice`` all ask for, so none skips a rule.

For each cluster, in order: the job's own ``resources.clusters`` list; for a job that has a
place already, not where a launch of it failed and, with checkpoints, only a cluster on the same
storage; never where it could not be admitted at all (the cluster's cap through ``caps_of``, the
team's quota); not where it cannot run (nodes, GPUs per node, image); why it would wait there,
when it would start, and its plan. Then the choice. The rules are ``service.core.placement``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlmodel import Session

from service.core.admission import Cap
from service.core.advice_memo import advise_once
from service.core.advisor import Advice
from service.core.clusters import ClusterProfile
from service.core.placement import Option, Placement, cannot_run, choose, listed, movable
from service.core.placement import planned as planned_there
from service.core.placement import summary as summary_of
from service.core.spec import JobSpec
from service.db.admission import refusal, would_wait
from service.db.calibrations import current as current_calibration
from service.db.cluster_bounds import caps_of
from service.db.placement import expected_start_s
from service.db.users import Caller

Planner = Callable[[JobSpec, ClusterProfile], Advice]


@dataclass(frozen=True)
class Moving:
    """A job that has a place already and is looking for another."""

    job_id: str
    cluster: str  # where it is now
    failed: frozenset[str] = frozenset()  # where a launch of it failed: never again
    has_checkpoints: bool = False  # then only a cluster that mounts the same storage
    holds_gpus: bool = False  # still launching there: its GPUs are no limit to it
    waits_here: str = ""  # why admission keeps it waiting where it is


@dataclass(frozen=True)
class Placed:
    """Every cluster considered, in the profiles' order, and the choice (None: nowhere)."""

    options: list[Option]
    chosen: Option | None
    by: Placement
    caps: dict[str, Cap]

    def summary(self) -> str:
        """The choice and the others in one paragraph, for the job's record."""
        assert self.chosen is not None
        return summary_of(self.options, self.chosen, self.by)

    def ruled_out(self) -> str:
        """Why each cluster ruled out was, "cluster: why; ..." ("" when none was)."""
        return "; ".join(f"{o.cluster}: {o.ruled_out}" for o in self.options if o.ruled_out)


@dataclass(frozen=True)
class _Asking:
    session: Session
    spec: JobSpec
    caller: Caller | None  # None: advice, planned as if every cluster were free
    borrowing: bool
    moving: Moving | None

    def waits(self, cluster: str, cap: Cap) -> str | None:
        """Why it would wait there ("": it would not; None: not known, for advice)."""
        if self.caller is None:
            return None
        moving = self.moving
        if moving is not None and moving.cluster == cluster and moving.waits_here:
            return moving.waits_here  # the full pass's word, not a guess at it
        gpus, priority = self.spec.resources.world_size, self.spec.priority
        why = would_wait(self.session, self.caller, cluster, gpus, priority, cap, self.borrowing,
                         self.moving_from, moving.job_id if moving else None)  # fmt: skip
        return why or ""

    def start_in_s(self, cluster: str, cap: Cap) -> float | None:
        assert self.caller is not None  # asked only where it would wait
        return expected_start_s(
            self.session, self.caller, cluster, self.spec.resources.world_size, cap,
            self.moving.job_id if self.moving else None, self.moving_from,
        )  # fmt: skip

    @property
    def moving_from(self) -> str | None:
        moving = self.moving
        return moving.cluster if moving is not None and moving.holds_gpus else None


def place(
    session: Session,
    spec: JobSpec,
    profiles: Mapping[str, ClusterProfile],
    caller: Caller | None,
    *,
    borrowing: bool = False,
    moving: Moving | None = None,
    plan: Planner | None = None,
) -> Placed:
    """Where ``spec`` can go among ``profiles`` and where it goes, for ``caller``'s team (None:
    were every cluster free, as advice plans it, still within each cluster's cap). ``plan``:
    how a cluster's plan is made; by default with that cluster's calibration."""
    plan = plan or calibrated_planner(session)
    asking = _Asking(session, spec, caller, borrowing, moving)
    considered = listed(spec, profiles.values())
    kept, left_out = _movable(considered, moving, profiles)
    caps = caps_of(session, {p.name: p for p in kept})
    ruled = {o.cluster: o for o in left_out}
    gpus = spec.resources.world_size
    for profile in kept:
        cap = caps[profile.name]
        if why := refusal(caller, profile.name, gpus, cap, borrowing) or cannot_run(spec, profile):
            ruled[profile.name] = Option(profile.name, ruled_out=why)
    options = [ruled.get(p.name) or _option(asking, p, caps[p.name], plan) for p in considered]
    by = spec.resources.placement
    return Placed(options, choose(options, by), by, caps)


def calibrated_planner(session: Session) -> Planner:
    """Each cluster's plan with that cluster's calibration (as stored, never fitted here)."""

    def planned(spec: JobSpec, profile: ClusterProfile) -> Advice:
        return advise_once(spec, profile, current_calibration(session, profile.name))

    return planned


def _movable(
    considered: list[ClusterProfile],
    moving: Moving | None,
    profiles: Mapping[str, ClusterProfile],
) -> tuple[list[ClusterProfile], list[Option]]:
    if moving is None:
        return considered, []
    here = profiles.get(moving.cluster)
    return movable(considered, set(moving.failed), here, moving.has_checkpoints)


def _option(asking: _Asking, profile: ClusterProfile, cap: Cap, plan: Planner) -> Option:
    waits = asking.waits(profile.name, cap)
    start = asking.start_in_s(profile.name, cap) if waits else None
    return planned_there(asking.spec, profile, plan, waits, start)
