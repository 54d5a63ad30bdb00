"""When each waiting job is expected to start and end, all at once, from a snapshot.

The jobs holding GPUs end at their predicted ends (``predicted_end``: the steps left at the
measured step time, else the plan's; without steps, the time limit; else unknown). The waiting
jobs are taken in admission order (``admit``'s ``considered``); each limit a job needs (its
team's quota, its cluster's cap) is a ``Pool`` whose holders free GPUs at their ends. A job
starts once every pool it needs has its GPUs free, never before the job ahead of it under the
same limit started, and holds them for its own predicted run time. A heap per limit: a job
costs a few heap operations, whatever the backlog.

Assumptions, stated with every prediction's basis where they apply: the fair-share order is
today's; with borrowing on, a team's limit is its quota plus its borrow limit (none when that is
unbounded) and the pool of idle quota is not modelled; a requeued job runs its whole length
again; backfill (``service.core.backfill``) is decided at admission, never predicted.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from service.core.admission import Held, Limits, Waiting

UNKNOWN = math.inf  # the end of a job whose length is not known


@dataclass(frozen=True)
class Length:
    """What is known of a job's length."""

    steps: int | None = None  # training.steps
    step_s: float | None = None  # its plan's predicted step time
    time_limit_s: float | None = None  # resources.time_limit_minutes

    def run_s(self) -> tuple[float | None, str]:
        """Its whole run, in seconds (None: not known), and what that rests on."""
        if self.steps is not None and self.step_s:
            return self.steps * self.step_s, f"{self.steps} steps at {self.step_s:.3g} s (planned)"
        if self.time_limit_s is not None:
            return self.time_limit_s, f"its time limit, {self.time_limit_s:.0f} s"
        return None, "its length is not known (no training.steps, no time limit)"


@dataclass(frozen=True)
class Progress:
    """The steps its current attempt reported: the first and last, and when they came."""

    first_step: int
    first_at: datetime
    last_step: int
    last_at: datetime

    def step_s(self) -> float | None:
        """The measured step time, None until two steps have been reported."""
        steps = self.last_step - self.first_step
        if steps <= 0:
            return None
        return (self.last_at - self.first_at).total_seconds() / steps


@dataclass(frozen=True)
class Holding:
    """A job holding GPUs now."""

    job_id: str
    team: str
    cluster: str
    gpus: int
    length: Length
    started_at: datetime | None = None  # its current attempt began running
    progress: Progress | None = None


@dataclass(frozen=True)
class Prediction:
    start_at: datetime | None  # None: not known
    end_at: datetime | None
    basis: str  # what it rests on, in words


def predicted_end(job: Holding, now: datetime) -> tuple[float, str]:
    """Seconds from ``now`` until the job ends (``UNKNOWN`` if not known), and why."""
    length, progress = job.length, job.progress
    measured = progress.step_s() if progress else None
    step_s = measured or length.step_s
    if length.steps is not None and step_s:
        done = progress.last_step if progress else 0
        left = max(length.steps - done, 0)
        since = progress.last_at if progress else job.started_at or now
        which = "measured" if measured else "planned"
        end = (since - now).total_seconds() + left * step_s
        return max(end, 0.0), f"{left} steps left at {step_s:.3g} s ({which})"
    if length.time_limit_s is not None:
        limit_end = (job.started_at or now) - now + timedelta(seconds=length.time_limit_s)
        return max(limit_end.total_seconds(), 0.0), f"its time limit, {length.time_limit_s:.0f} s"
    return UNKNOWN, "its length is not known"


@dataclass
class Pool:
    """One limit's GPUs over time: what is free, and when each holder frees its GPUs."""

    name: str  # in words, e.g. "cluster local's 2-GPU cap"
    capacity: int
    free: int
    ends: list[tuple[float, int, str]] = field(default_factory=list)  # heap: end, GPUs, whose
    clock: float = 0.0  # no job under this limit starts before the one ahead of it did
    clock_why: str = ""

    def hold(self, end_s: float, gpus: int, whose: str) -> None:
        """A job starting now takes ``gpus`` until ``end_s``."""
        self.free -= gpus
        self.ending(end_s, gpus, whose)

    def ending(self, end_s: float, gpus: int, whose: str) -> None:
        """A holder counted in ``free`` already gives back ``gpus`` at ``end_s``."""
        heapq.heappush(self.ends, (end_s, gpus, whose))

    def ready(self, gpus: int, at: float) -> tuple[float, str] | None:
        """The first moment from ``at`` with ``gpus`` free, and why then; None: not known."""
        if self.clock == UNKNOWN:  # behind a job whose start is not known
            return None
        why = self.clock_why if self.clock > at else "its GPUs are free now"
        at = max(at, self.clock)
        while self.ends and self.ends[0][0] <= at:
            self._release()
        while self.free < gpus:
            if not self.ends or self.ends[0][0] == UNKNOWN:
                return None
            at, _gpus, whose = self.ends[0]
            self._release()
            why = f"{self.name} frees enough when {whose}"
        return at, why

    def _release(self) -> None:
        _end, gpus, _whose = heapq.heappop(self.ends)
        self.free += gpus


def with_started(
    jobs: Sequence[Waiting], lengths: Mapping[str, Length], held: Held, now: datetime
) -> tuple[Held, list[Holding]]:
    """What is held once ``jobs`` start now, and those jobs as holders for their whole run."""
    by_team, by_cluster = dict(held.by_team), dict(held.by_cluster)
    holders = []
    for job in jobs:
        by_team[job.team] = by_team.get(job.team, 0) + job.gpus
        by_cluster[job.cluster] = by_cluster.get(job.cluster, 0) + job.gpus
        length = lengths.get(job.job_id, Length())
        holders.append(Holding(job.job_id, job.team, job.cluster, job.gpus, length, now))
    return Held(by_team, by_cluster), holders


def forecast(
    waiting: Sequence[Waiting],
    order: Sequence[str],
    lengths: Mapping[str, Length],
    holding: Sequence[Holding],
    held: Held,
    limits: Limits,
    now: datetime,
) -> dict[str, Prediction]:
    """Each waiting job's predicted start and end, taken in ``order`` (admission's)."""
    pools = _pools(holding, held, limits, now)
    by_id = {job.job_id: job for job in waiting}
    return {
        job_id: _predict(by_id[job_id], lengths.get(job_id, Length()), pools, now)
        for job_id in order
        if job_id in by_id
    }


def _predict(job: Waiting, length: Length, pools: dict[str, Pool], now: datetime) -> Prediction:
    needed = [pools[key] for key in _limit_keys(job.team, job.cluster) if key in pools]
    if any(job.gpus > pool.capacity for pool in needed):
        return Prediction(None, None, "it needs more GPUs than a whole limit: it never starts")
    started = _start(needed, job.gpus)
    run_s, run_why = length.run_s()
    if started is None:
        for pool in needed:  # no one behind it under these limits has a known start either
            pool.clock, pool.clock_why = UNKNOWN, f"behind job {job.job_id}"
        return Prediction(None, None, "start not known: it waits for a job of unknown length")
    at, why = started
    end_s = UNKNOWN if run_s is None else at + run_s
    for pool in needed:
        pool.hold(end_s, job.gpus, f"job {job.job_id} ends ({run_why})")
        pool.clock, pool.clock_why = at, f"after job {job.job_id}, ahead of it, starts"
    end_at = None if run_s is None else now + timedelta(seconds=end_s)
    return Prediction(now + timedelta(seconds=at), end_at, f"start: {why}; run: {run_why}")


def _start(pools: list[Pool], gpus: int) -> tuple[float, str] | None:
    """The first moment every pool has ``gpus`` free, and why then; None: not known."""
    at, why = 0.0, "its GPUs are free now"
    moved = True
    while moved:  # a later moment in one pool may need more releases in another
        moved = False
        for pool in pools:
            ready = pool.ready(gpus, at)
            if ready is None:
                return None
            if ready[0] > at:
                (at, why), moved = ready, True
    return at, why


def _limit_keys(team: str, cluster: str) -> list[str]:
    return [f"team {team}", f"cluster {cluster}"]


def _pools(
    holding: Sequence[Holding], held: Held, limits: Limits, now: datetime
) -> dict[str, Pool]:
    pools: dict[str, Pool] = {}
    for team, quota in limits.team_quota.items():
        if (limit := _team_limit(team, quota, limits)) is not None:
            free = limit - held.by_team.get(team, 0)
            pools[f"team {team}"] = Pool(f"team {team}'s {limit}-GPU limit", limit, free)
    for cluster, cap in limits.cluster_cap.items():
        if cap is not None:
            free = cap - held.by_cluster.get(cluster, 0)
            pools[f"cluster {cluster}"] = Pool(f"cluster {cluster}'s {cap}-GPU cap", cap, free)
    for job in holding:
        end_s, why = predicted_end(job, now)
        for key in _limit_keys(job.team, job.cluster):
            if (pool := pools.get(key)) is not None:
                pool.ending(end_s, job.gpus, f"job {job.job_id} ends ({why})")
    return pools


def _team_limit(team: str, quota: int | None, limits: Limits) -> int | None:
    """The GPUs a team may hold: its quota; with borrowing, plus its borrow limit."""
    if quota is None or not limits.borrowing:
        return quota
    borrow = limits.team_borrow_limit.get(team)
    return None if borrow is None else quota + borrow
