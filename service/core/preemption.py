"""Preemption: which running jobs stop so that a waiting one can start.

Admission (``service.core.admission``) starts what fits. When the job first in line does not
fit, this policy may name victims, who are then stopped gracefully (SIGTERM, a save, requeued
at their original place; ``docs/scheduling.md``):

- **reclaim**: a team within its nominal quota takes back GPUs that other teams borrow;
- **priority**: a higher-priority job stops lower-priority jobs of its own team, and of other
  teams only where those borrow (or where the operator allows it across teams).

Victims are the smallest set that frees enough, taken in this order: borrowers first, then the
lowest priority, then the least work lost per GPU freed (GPU-seconds since the victim's last
complete checkpoint, over its GPUs), then the most recently started; a victim the others make
unnecessary is dropped again. A job that has run less than the minimum runtime is
never a victim, and a job never preempts the job that preempted it (no loops). Pure: the
database layer gathers the snapshot and stops the victims.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from service.core.admission import Held, Limits, Waiting

DEFAULT_MIN_RUNTIME_S = 600.0  # a job that just started has done nothing worth stopping for
BACKOFF_DOUBLINGS = 4  # the back-off stops growing at 16x its first length


@dataclass(frozen=True)
class Running:
    """An admitted job that holds GPUs now."""

    job_id: str
    team: str
    cluster: str
    gpus: int
    priority: int
    borrowing: bool  # admitted past its team's quota
    started_at: datetime  # of its current attempt
    checkpoint_at: datetime | None = None  # its last complete checkpoint
    checkpoint_step: int | None = None

    def lost_s(self, now: datetime) -> float:
        """GPU-seconds of work since its last complete checkpoint: what a hard stop loses."""
        since = self.checkpoint_at or self.started_at
        return self.gpus * max((now - since).total_seconds(), 0.0)


@dataclass(frozen=True)
class Policy:
    min_runtime_s: float = DEFAULT_MIN_RUNTIME_S
    across_teams: bool = False  # priority preemption of other teams' jobs within their quota
    # The Kueue-like baseline of bench/replay_week.py: the newest victims first, and a requeued
    # job may stop its preemptor at once. zeropilot's own policy keeps both False.
    newest_first: bool = False
    allow_preempting_back: bool = False


def borrow_backoff(
    preemptions: int, requeued_at: datetime | None, now: datetime, first_s: float
) -> datetime | None:
    """Until when a job preempted ``preemptions`` times (back in the queue since
    ``requeued_at``) may not borrow again, or None when it may. Borrowing again at once is
    what makes a job the next victim (Kueue's users call it a preemption loop): the back-off
    is ``first_s`` (the minimum runtime) after the first preemption and doubles with each one
    after, up to ``2**BACKOFF_DOUBLINGS`` times; within its own quota a job starts at once."""
    if preemptions <= 0 or requeued_at is None or first_s <= 0:
        return None
    wait_s = first_s * 2 ** min(preemptions - 1, BACKOFF_DOUBLINGS)
    until = requeued_at + timedelta(seconds=wait_s)
    return until if until > now else None


@dataclass(frozen=True)
class Preemption:
    job_id: str  # the waiting job the victims make room for
    victims: tuple[str, ...]
    reasons: dict[str, str]  # victim -> why, in words


def choose_victims(
    job: Waiting,
    running: Sequence[Running],
    held: Held,
    limits: Limits,
    now: datetime,
    policy: Policy = Policy(),
) -> Preemption | None:
    """The victims that let ``job`` start, or None when no allowed set frees enough."""
    team_need, pool_need = _needs(job, held, limits, running)
    if team_need <= 0 and pool_need <= 0:
        return None  # it fits already: admission, not preemption, starts it
    reclaiming = _within_quota(job, held, limits)
    if job.borrow_after is not None and not reclaiming:
        return None  # it would start by borrowing, which its back-off does not allow yet
    candidates = sorted(
        (r for r in running if _may_stop(job, r, reclaiming, limits, now, policy)),
        # Lost work per GPU freed: one 4-GPU job a minute past its checkpoint costs less than
        # four 1-GPU jobs two minutes past theirs.
        key=lambda r: (
            not r.borrowing,
            r.priority,
            r.lost_s(now) / r.gpus,
            -r.started_at.timestamp(),
        ),
    )
    chosen = _smallest_set(job, candidates, team_need, pool_need, limits)
    if chosen is None:
        return None
    reasons = {r.job_id: _reason(job, r, reclaiming, now) for r in chosen}
    return Preemption(job.job_id, tuple(r.job_id for r in chosen), reasons)


def _needs(job: Waiting, held: Held, limits: Limits, running: Sequence[Running]) -> tuple[int, int]:
    """GPUs to free inside the job's team (its quota) and in the pool it runs in."""
    team_need = 0
    quota = limits.team_quota.get(job.team)
    if quota is not None and not limits.borrowing:
        team_need = held.by_team.get(job.team, 0) + job.gpus - quota
    capacity = limits.capacity(job.cluster)
    if capacity is None:
        return team_need, 0
    in_pool = [r for r in running if _same_pool(job, r, limits)]
    pool_need = sum(r.gpus for r in in_pool) + job.gpus - capacity
    return team_need, pool_need


def _same_pool(job: Waiting, other: Running, limits: Limits) -> bool:
    """Whether ``other`` uses the capacity ``job`` needs: its cluster's cap, or the pool of
    quotas (which teams without a quota stand outside of)."""
    if limits.cluster_cap.get(job.cluster) is None:
        return limits.in_pool(other.team)
    return other.cluster == job.cluster


def _within_quota(job: Waiting, held: Held, limits: Limits) -> bool:
    quota = limits.team_quota.get(job.team)
    return quota is not None and held.by_team.get(job.team, 0) + job.gpus <= quota


def _may_stop(
    job: Waiting, victim: Running, reclaiming: bool, limits: Limits, now: datetime, policy: Policy
) -> bool:
    if victim.job_id in job.preempted_by and not policy.allow_preempting_back:
        return False  # it took this job's GPUs: never straight back
    if (now - victim.started_at).total_seconds() < policy.min_runtime_s:
        return False
    if not _same_pool(job, victim, limits) and victim.team != job.team:
        return False
    if victim.team == job.team:
        return victim.priority < job.priority
    if victim.borrowing and (reclaiming or victim.priority < job.priority):
        return True
    return policy.across_teams and victim.priority < job.priority


def _smallest_set(
    job: Waiting,
    candidates: list[Running],
    team_need: int,
    pool_need: int,
    limits: Limits,
) -> list[Running] | None:
    """Candidates in order until both needs are met, then without any that was not needed."""

    def frees(chosen: list[Running]) -> bool:
        team = sum(r.gpus for r in chosen if r.team == job.team)
        pool = sum(r.gpus for r in chosen if _same_pool(job, r, limits))
        return team >= team_need and pool >= pool_need

    chosen: list[Running] = []
    for victim in candidates:
        if frees(chosen):
            break
        chosen.append(victim)
    if not frees(chosen):
        return None
    for victim in reversed(list(chosen)):  # the last taken are the least preferred victims
        rest = [r for r in chosen if r is not victim]
        if rest and frees(rest):
            chosen = rest
    return chosen


def _reason(job: Waiting, victim: Running, reclaiming: bool, now: datetime) -> str:
    if victim.team != job.team and victim.borrowing and reclaiming:
        why = f"team {job.team} reclaims GPUs of its quota that team {victim.team} borrows"
    elif victim.team == job.team:
        why = f"it has priority {victim.priority}, below the job's"
    else:
        why = f"it borrows GPUs and has priority {victim.priority}, below the job's"
    since = victim.checkpoint_at or victim.started_at
    point = f"step-{victim.checkpoint_step} checkpoint" if victim.checkpoint_step else "start"
    return (
        f"preempted by job {job.job_id} (priority {job.priority}, team {job.team}): {why}; a"
        f" stop without a save would lose {_duration((now - since).total_seconds())} since its"
        f" {point}"
    )


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"
