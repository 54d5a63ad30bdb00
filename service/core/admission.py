"""Admission: which waiting jobs may start now, under team quotas, priorities and fair share.

A submitted job waits (PENDING) until admission lets it go (QUEUED, then launched). Two limits
apply, both counted in GPUs (nodes x GPUs per node) held by admitted, unfinished jobs:

- a team's quota: what one team may hold at once (None: no limit); a job over it waits, and
  other teams' jobs go by;
- a cluster's cap: what zeropilot admits onto one cluster (None: no limit, the cluster's own
  scheduler queues): the profile's ``max_gpus``, or lower where the cluster itself limits
  zeropilot (a Kubernetes namespace's GPU quota, ``Cap.source`` names it). A job over it
  waits, and so does every job ordered after it on that cluster, so a large job is never
  starved by a stream of small ones; ``service.core.backfill`` may then let through those
  predicted to give the GPUs back before its reserved start. A job larger than the whole cap
  (stored before the cap was lowered) waits without holding anyone back.

Order among waiting jobs: higher priority first; then fair share, the team holding the fewest
GPUs per share unit first (recomputed after each admission, so two teams with equal shares
alternate); then the oldest. Pure: the database layer gathers the inputs and applies the result.

With borrowing on, a quota is a team's nominal share, not a wall: a job over it is admitted
into idle capacity (the cluster's cap, or the quotas of the teams that have one, together,
where no cap is set), up to the team's borrow limit, and is marked as borrowing;
``service.core.preemption`` takes those GPUs back when their owner needs them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from service.core.states import JobStatus

# Statuses in which a job holds its GPUs: from admission until it ends.
HOLDING = frozenset(
    {JobStatus.QUEUED, JobStatus.LAUNCHING, JobStatus.RUNNING, JobStatus.ESCALATING}
)


def gpus_of(spec: dict[str, Any]) -> int:
    """The GPUs a stored job spec asks for: nodes x GPUs per node."""
    resources = spec["resources"]
    return int(resources["nodes"]) * int(resources["gpus_per_node"])


@dataclass(frozen=True)
class Waiting:
    """A job waiting for admission."""

    job_id: str
    team: str
    cluster: str
    gpus: int
    priority: int
    submitted_at: datetime
    preempted_by: frozenset[str] = frozenset()  # jobs that took its GPUs: never its victims
    # Preempted lately: it may not borrow until then (service.core.preemption.borrow_backoff)
    borrow_after: datetime | None = None


@dataclass(frozen=True)
class Cap:
    """What zeropilot admits onto one cluster at once, in GPUs (None: no limit), and, when a
    limit of the cluster's own set it, that limit in words."""

    gpus: int | None = None
    source: str = ""  # e.g. "namespace quota ml/gpus: requests.nvidia.com/gpu=16"


def bounded_cap(max_gpus: int | None, bound: int | None, source: str) -> Cap:
    """The lower of the profile's ``max_gpus`` and a limit read on the cluster (``source``)."""
    if bound is None or (max_gpus is not None and max_gpus <= bound):
        return Cap(max_gpus)
    return Cap(bound, source)


@dataclass(frozen=True)
class Limits:
    team_quota: dict[str, int | None] = field(default_factory=dict)  # GPUs; absent: no limit
    team_share: dict[str, int] = field(default_factory=dict)  # fair-share weight; absent: 1
    cluster_cap: dict[str, int | None] = field(default_factory=dict)  # GPUs; absent: no limit
    cap_source: dict[str, str] = field(default_factory=dict)  # a cap the cluster set, in words
    borrowing: bool = False  # may a team run past its quota on GPUs no one else uses now
    team_borrow_limit: dict[str, int | None] = field(default_factory=dict)  # absent: no limit
    # A requeued victim goes after the job it was stopped for (False: the Kueue-like baseline
    # of bench/replay_week.py, where it may take its GPUs back first)
    victims_after_preemptors: bool = True

    def capacity(self, cluster: str) -> int | None:
        """The GPUs borrowers may fill: the cluster's cap, else the quotas of the teams that
        have one, together (teams without a quota stand outside the pool: no limit, no loan);
        None when no team has a quota."""
        if (cap := self.cluster_cap.get(cluster)) is not None:
            return cap
        quotas = [q for q in self.team_quota.values() if q is not None]
        return sum(quotas) if quotas else None

    @classmethod
    def of_caps(cls, caps: dict[str, Cap], **limits: Any) -> Limits:
        """Limits whose cluster caps are ``caps``."""
        cluster_cap = {name: cap.gpus for name, cap in caps.items()}
        sources = {name: cap.source for name, cap in caps.items() if cap.source}
        return cls(cluster_cap=cluster_cap, cap_source=sources, **limits)

    def cap_words(self, cluster: str) -> str:
        """The limit that set the cluster's cap, in parentheses, when the cluster set it."""
        source = self.cap_source.get(cluster)
        return f" ({source})" if source else ""

    def in_pool(self, team: str) -> bool:
        """Whether the team's GPUs count in the nominal pool (where no cluster cap is set)."""
        return self.team_quota.get(team) is not None


@dataclass
class Held:
    """GPUs held by admitted, unfinished jobs."""

    by_team: dict[str, int] = field(default_factory=dict)
    by_cluster: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    admitted: list[str]  # job ids, in admission order
    waiting: dict[str, str]  # job id -> why it still waits, in words
    borrowing: frozenset[str] = frozenset()  # admitted past their team's quota
    # How it was reached, for predictions and backfill (not part of the decision's equality):
    # every job id in the order admission took them; each cluster's first job over its cap.
    considered: tuple[str, ...] = field(default=(), compare=False)
    blocked: dict[str, str] = field(default_factory=dict, compare=False)


def admit(waiting: list[Waiting], held: Held, limits: Limits) -> Decision:
    """Admit what fits, in order, and say why the rest waits."""
    by_team = dict(held.by_team)
    by_cluster = dict(held.by_cluster)
    queues = _queues_by_team(waiting)
    admitted: list[str] = []
    borrowing: set[str] = set()
    reasons: dict[str, str] = {}
    blocked: dict[str, str] = {}  # clusters where an earlier job is waiting for the cap
    considered: list[str] = []
    # GPUs held in the nominal pool (where no cluster cap is set): by teams with a quota
    in_use = sum(gpus for team, gpus in held.by_team.items() if limits.in_pool(team))
    still_waiting = {job.job_id for job in waiting}
    # Victims whose preemptor still waits go after everyone else: by their older submit time
    # they would take back the GPUs they gave up, and be stopped again (a preemption loop).
    deferred: list[Waiting] = []

    def order(job: Waiting) -> tuple[int, float, datetime, str]:
        share = max(limits.team_share.get(job.team, 1), 1)
        return (-job.priority, by_team.get(job.team, 0) / share, job.submitted_at, job.job_id)

    def consider(job: Waiting) -> None:
        nonlocal in_use
        considered.append(job.job_id)
        if job.cluster in blocked:
            reasons[job.job_id] = f"behind an earlier job waiting for cluster {job.cluster}"
            return
        if why := _over_quota(job, by_team, limits):
            if limits.borrowing:
                why = _cannot_borrow(job, by_team, by_cluster, in_use, limits)
            if why:
                reasons[job.job_id] = why
                return
            borrowing.add(job.job_id)
        elif why := _pool_lent(job, in_use, limits):
            reasons[job.job_id] = why  # preemption reclaims what is lent
            return
        if why := _over_cap(job, by_cluster, limits):
            borrowing.discard(job.job_id)
            if beyond := _beyond_cap(job, limits):  # it can never start: it holds no one back
                reasons[job.job_id] = beyond
                return
            reasons[job.job_id] = why
            blocked[job.cluster] = job.job_id
            return
        admitted.append(job.job_id)
        still_waiting.discard(job.job_id)
        by_team[job.team] = by_team.get(job.team, 0) + job.gpus
        by_cluster[job.cluster] = by_cluster.get(job.cluster, 0) + job.gpus
        in_use += job.gpus if limits.in_pool(job.team) else 0

    while queues:
        # Within a team the order needs no fair share: the next job is the best team's head.
        team = min(queues, key=lambda name: order(queues[name][0]))
        job = queues[team].popleft()
        if not queues[team]:
            del queues[team]
        if limits.victims_after_preemptors and job.preempted_by & still_waiting:
            deferred.append(job)
        else:
            consider(job)
    for job in deferred:  # their preemptors have been considered: what is left is theirs
        consider(job)
    return Decision(admitted, reasons, frozenset(borrowing), tuple(considered), blocked)


def _queues_by_team(waiting: list[Waiting]) -> dict[str, deque[Waiting]]:
    """Each team's jobs in the order they would go, were the team alone."""
    queues: dict[str, deque[Waiting]] = {}
    for job in sorted(waiting, key=lambda j: (-j.priority, j.submitted_at, j.job_id)):
        queues.setdefault(job.team, deque()).append(job)
    return queues


def _over_quota(job: Waiting, by_team: dict[str, int], limits: Limits) -> str | None:
    quota = limits.team_quota.get(job.team)
    held = by_team.get(job.team, 0)
    if quota is not None and held + job.gpus > quota:
        return f"team {job.team} holds {held} of its {quota}-GPU quota; this job needs {job.gpus}"
    return None


def _cannot_borrow(
    job: Waiting, by_team: dict[str, int], by_cluster: dict[str, int], in_use: int, limits: Limits
) -> str | None:
    """Why a job over its team's quota may not borrow idle GPUs, or None when it may."""
    quota = limits.team_quota.get(job.team) or 0
    if job.borrow_after is not None:
        return (
            f"preempted {len(job.preempted_by)}x, it may borrow again from"
            f" {job.borrow_after:%Y-%m-%d %H:%M:%S} UTC (a back-off that doubles with each"
            f" preemption); within team {job.team}'s {quota}-GPU quota it may start at once"
        )
    over = by_team.get(job.team, 0) + job.gpus - quota  # what the team would borrow with it
    limit = limits.team_borrow_limit.get(job.team)
    if limit is not None and over > limit:
        return (
            f"team {job.team} would borrow {over} GPUs past its {quota}-GPU quota with this job;"
            f" its borrow limit is {limit}"
        )
    capacity = limits.capacity(job.cluster)
    capped = limits.cluster_cap.get(job.cluster) is not None
    used = by_cluster.get(job.cluster, 0) if capped else in_use
    if capacity is None or used + job.gpus > capacity:
        pool = f"{used} of {capacity} GPUs in use" if capacity is not None else "no pool to lend"
        return (
            f"team {job.team} holds {by_team.get(job.team, 0)} of its {quota}-GPU quota and no"
            f" idle GPUs are left to borrow ({pool}); this job needs {job.gpus}"
        )
    return None


def _pool_lent(job: Waiting, in_use: int, limits: Limits) -> str | None:
    """Why a job within its quota waits: the quota pool is full because GPUs are lent out
    (where a cluster cap is set, the cap itself decides)."""
    if not limits.borrowing or limits.cluster_cap.get(job.cluster) is not None:
        return None
    capacity = limits.capacity(job.cluster)
    if capacity is None or in_use + job.gpus <= capacity:
        return None
    return (
        f"team {job.team} is within its quota, but {in_use} of the pool's {capacity} GPUs are in"
        f" use, some lent to other teams; this job needs {job.gpus}"
    )


def _over_cap(job: Waiting, by_cluster: dict[str, int], limits: Limits) -> str | None:
    cap = limits.cluster_cap.get(job.cluster)
    held = by_cluster.get(job.cluster, 0)
    if cap is not None and held + job.gpus > cap:
        return (
            f"cluster {job.cluster} has {held} of its {cap} GPUs admitted"
            f"{limits.cap_words(job.cluster)}; this job needs {job.gpus}"
        )
    return None


def _beyond_cap(job: Waiting, limits: Limits) -> str | None:
    """Why the job needs more than the cluster's whole cap (one lowered under it), or None."""
    too_small = _cap_too_small(job.gpus, job.cluster, limits)
    if too_small is None:
        return None
    return f"{too_small}; it waits for that limit to be raised, and the jobs behind it go on"


def _cap_too_small(gpus: int, cluster: str, limits: Limits) -> str | None:
    cap = limits.cluster_cap.get(cluster)
    if cap is None or gpus <= cap:
        return None
    return (
        f"the job needs {gpus} GPUs and zeropilot admits at most {cap} on {cluster}"
        f"{limits.cap_words(cluster)}"
    )


def never_fits(gpus: int, team: str, cluster: str, limits: Limits) -> str | None:
    """Why a job can never be admitted (it needs more than a whole limit), or None."""
    quota = limits.team_quota.get(team)
    if quota is not None and gpus > quota:
        return f"the job needs {gpus} GPUs and team {team}'s quota is {quota}"
    return _cap_too_small(gpus, cluster, limits)
