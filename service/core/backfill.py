"""Backfill: the GPUs a blocked job cannot use yet, lent to the jobs behind it that give them
back in time.

``admit`` keeps every job behind the first one over a cluster's cap waiting, so a large job is
never starved by a stream of small ones. That first job gets a reservation: the first moment
the cluster's holders (those ``admit`` just let start included, at their predicted run times)
free enough GPUs for it (``service.core.forecast.predicted_end``). A job behind it may start
now, when it fits now under every other rule of ``admit``, if it is predicted to end before the
reservation with a margin to spare, or if it uses only GPUs that will be free at the reservation
beyond the first job's need. Either way the reservation does not move later while the
predictions hold. A job whose length is not known never passes; nor does anyone where the
reservation itself rests on a job of unknown length.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from service.core.admission import Decision, Held, Limits, Waiting, admit
from service.core.forecast import Holding, Length, Pool, predicted_end, with_started


@dataclass(frozen=True)
class Margin:
    """How much longer than predicted a job that ends before a reservation may run: a share
    of its predicted run, never less than a floor (the predictions' error, docs/scheduling.md)."""

    floor_s: float = 60.0
    share: float = 0.25

    def of(self, run_s: float) -> float:
        return max(self.floor_s, self.share * run_s)


@dataclass(frozen=True)
class Reservation:
    job_id: str
    at: datetime  # its reserved start
    spare: int  # GPUs free then beyond its need


@dataclass(frozen=True)
class Backfill:
    admitted: list[str]  # in the order they passed
    reasons: dict[str, str]  # each one's pass, in words
    reservations: dict[str, Reservation] = field(default_factory=dict)  # by cluster
    borrowing: frozenset[str] = frozenset()


def reserve(
    first: Waiting, holders: Sequence[Holding], used: Held, limits: Limits, now: datetime
) -> Reservation | None:
    """When ``first`` can start on its capped cluster; None when that is not known."""
    cap = limits.cluster_cap.get(first.cluster)
    if cap is None:
        return None
    pool = Pool(first.cluster, cap, cap - used.by_cluster.get(first.cluster, 0))
    for job in holders:
        if job.cluster == first.cluster:
            pool.ending(predicted_end(job, now)[0], job.gpus, job.job_id)
    ready = pool.ready(first.gpus, 0.0)
    if ready is None:
        return None
    return Reservation(first.job_id, now + timedelta(seconds=ready[0]), pool.free - first.gpus)


@dataclass
class _Passing:
    """What backfill has let through so far, and the GPUs held with them."""

    used: Held
    admitted: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    borrowing: set[str] = field(default_factory=set)

    def let_through(self, job: Waiting, why: str, borrowing: bool) -> None:
        self.admitted.append(job.job_id)
        self.reasons[job.job_id] = why
        if borrowing:
            self.borrowing.add(job.job_id)
        by_team, by_cluster = dict(self.used.by_team), dict(self.used.by_cluster)
        by_team[job.team] = by_team.get(job.team, 0) + job.gpus
        by_cluster[job.cluster] = by_cluster.get(job.cluster, 0) + job.gpus
        self.used = Held(by_team, by_cluster)


def backfill(
    waiting: Sequence[Waiting],
    decision: Decision,
    lengths: Mapping[str, Length],
    holding: Sequence[Holding],
    held: Held,
    limits: Limits,
    now: datetime,
    margin: Margin,
) -> Backfill:
    """The jobs behind each cluster's blocked job that may start now (``decision``: admit's)."""
    by_id = {job.job_id: job for job in waiting}
    admitted = [by_id[job_id] for job_id in decision.admitted]
    used, started = with_started(admitted, lengths, held, now)
    passing = _Passing(used)
    holders = [*holding, *started]
    reservations = {}
    for cluster, first_id in decision.blocked.items():
        reservation = reserve(by_id[first_id], holders, passing.used, limits, now)
        if reservation is None:
            continue
        reservations[cluster] = reservation
        after = decision.considered[decision.considered.index(first_id) + 1 :]
        behind = [by_id[job_id] for job_id in after if by_id[job_id].cluster == cluster]
        _pass_behind(behind, reservation, lengths, limits, now, margin, passing)
    borrowing = frozenset(passing.borrowing)
    return Backfill(passing.admitted, passing.reasons, reservations, borrowing)


def _pass_behind(
    behind: list[Waiting],
    reservation: Reservation,
    lengths: Mapping[str, Length],
    limits: Limits,
    now: datetime,
    margin: Margin,
    passing: _Passing,
) -> None:
    spare = reservation.spare
    for job in behind:
        run_s = lengths.get(job.job_id, Length()).run_s()[0]
        if run_s is None:  # its end could be after the reservation, by any amount
            continue
        alone = admit([job], passing.used, limits)  # quotas, borrowing, the GPUs free now
        if not alone.admitted:
            continue
        ends = now + timedelta(seconds=run_s + margin.of(run_s))
        reserved = f"job {reservation.job_id}'s reserved start at {reservation.at:%H:%M:%S} UTC"
        if ends <= reservation.at:
            why = f"predicted to end by {ends:%H:%M:%S} UTC with its margin, before {reserved}"
        elif job.gpus <= spare:
            spare -= job.gpus  # held past the reservation: out of what it leaves free
            why = f"it uses only GPUs that {reserved} leaves free"
        else:
            continue
        passing.let_through(job, f"backfilled: {why}", bool(alone.borrowing))
