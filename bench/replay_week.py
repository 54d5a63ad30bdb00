"""Replay a week of a shared GPU cluster through the admission and preemption policies.

A generated trace (three teams with nominal quotas over one pool, bursts that leave one team
idle while another has a backlog, 1- to 16-GPU jobs of minutes to days, three priorities,
checkpoint intervals and save times) runs minute by minute under three policies, each with the
same pure functions zeropilot runs (``service.core.admission.admit``,
``service.core.preemption.choose_victims``):

- ``hard quota``: today's admission: quotas are walls, no preemption;
- ``kueue-like``: borrowing; victims borrowers first, lowest priority, then the newest; no
  minimum runtime; a requeued job may preempt back; an evicted job is told nothing, so it
  loses the work since its last interval checkpoint (its 30 s grace is a plain SIGTERM);
- ``zeropilot``: borrowing; victims borrowers first, lowest priority, least work lost per GPU; a
  10-minute minimum runtime; no preempting back; a stopped job saves (its save time is the only
  GPU time it loses) and is requeued at its original submit time; a preempted job borrows again
  only after a back-off (10 minutes, doubling with each preemption; within its own quota it
  starts at once). ``zeropilot, no back-off`` is the same without the back-off.

    python bench/replay_week.py [--seed 7] [--days 7]

Reported per policy: GPU utilisation over the minutes when demand exceeds capacity, the p50 and
p95 wait of high-priority jobs (submit to first start), GPU-hours lost to preemption (redone
work plus time spent stopping), preemptions per job, and jobs finished.
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from service.core.admission import Held, Limits, Waiting, admit
from service.core.preemption import Policy, Running, borrow_backoff, choose_victims

TICK_S = 60
START = datetime(2026, 11, 23, tzinfo=UTC)
QUOTAS = {"vision": 16, "speech": 16, "nlp": 32}  # a 64-GPU pool
HIGH = 90


@dataclass
class Job:
    id: str
    team: str
    gpus: int
    priority: int
    work_s: float  # GPU-time per GPU the job needs
    interval_s: float  # between its interval checkpoints
    save_s: float  # one save
    submitted: datetime
    done_s: float = 0.0
    saved_s: float = 0.0  # progress in its last complete checkpoint
    saved_at: datetime | None = None
    started: datetime | None = None  # of the current run
    first_start: datetime | None = None
    borrowing: bool = False
    stopping_until: datetime | None = None
    graceful: bool = False
    preempted_by: set[str] = field(default_factory=set)
    preemptions: int = 0
    requeued_at: datetime | None = None
    finished: datetime | None = None


def trace(seed: int, days: int) -> list[Job]:
    """Bursty arrivals per team: each team alternates busy and quiet stretches of hours."""
    rng = random.Random(seed)
    jobs: list[Job] = []
    for team in QUOTAS:
        t = START + timedelta(minutes=rng.uniform(0, 600))
        while t < START + timedelta(days=days):
            busy = rng.random() < 0.6
            stretch = timedelta(hours=rng.uniform(4, 18))
            end = t + stretch
            while busy and t < end:
                jobs.append(_job(rng, f"{team}-{len(jobs)}", team, t))
                t += timedelta(minutes=rng.expovariate(1 / 25))
            t = max(t, end)
    return sorted(jobs, key=lambda j: j.submitted)


def _job(rng: random.Random, job_id: str, team: str, at: datetime) -> Job:
    gpus = rng.choices([1, 2, 4, 8, 16], weights=[30, 25, 25, 15, 5])[0]
    priority = rng.choices([10, 50, HIGH], weights=[30, 60, 10])[0]
    hours = min(rng.lognormvariate(0.5, 1.3), 72.0)  # minutes to days, median ~1.6 h
    return Job(
        job_id, team, gpus, priority, hours * 3600, rng.choice([1800.0, 7200.0]),
        10.0 + 10.0 * gpus * rng.uniform(0.5, 1.5), at,
    )  # fmt: skip


@dataclass(frozen=True)
class Scheme:
    name: str
    borrowing: bool
    preemption: Policy | None
    graceful: bool
    backoff: bool = False  # a preempted job waits before it borrows again


SCHEMES = (
    Scheme("hard quota", borrowing=False, preemption=None, graceful=False),
    Scheme(
        "kueue-like",
        borrowing=True,
        preemption=Policy(min_runtime_s=0, newest_first=True, allow_preempting_back=True),
        graceful=False,
    ),
    Scheme("zeropilot, no back-off", borrowing=True, preemption=Policy(), graceful=True),
    Scheme("zeropilot", borrowing=True, preemption=Policy(), graceful=True, backoff=True),
)


def replay(jobs: list[Job], scheme: Scheme, days: int) -> dict[str, float]:
    kueue_like = scheme.preemption is not None and scheme.preemption.allow_preempting_back
    limits = Limits(
        team_quota=dict(QUOTAS), borrowing=scheme.borrowing, victims_after_preemptors=not kueue_like
    )
    capacity = sum(QUOTAS.values())
    arrivals = list(jobs)
    waiting: list[Job] = []
    running: list[Job] = []
    lost_gpu_s = 0.0
    busy_while_short: list[float] = []
    now = START
    while now < START + timedelta(days=days) or waiting or running:
        while arrivals and arrivals[0].submitted <= now:
            waiting.append(arrivals.pop(0))
        for job in list(running):
            if job.stopping_until is not None:
                if now >= job.stopping_until:
                    lost_gpu_s += _requeue(job, scheme.graceful)
                    job.requeued_at = now
                    running.remove(job)
                    waiting.append(job)
                continue
            job.done_s += TICK_S
            if job.done_s >= job.work_s:
                job.finished = now
                running.remove(job)
            elif job.done_s - job.saved_s >= job.interval_s:
                job.saved_s, job.saved_at = job.done_s, now
        demand = sum(j.gpus for j in waiting) + sum(j.gpus for j in running)
        if demand > capacity and now < START + timedelta(days=days):
            busy_while_short.append(sum(j.gpus for j in running) / capacity)
        _admit(waiting, running, limits, now, scheme)
        if scheme.preemption is not None:
            _preempt(waiting, running, limits, now, scheme)
        now += timedelta(seconds=TICK_S)
        if now > START + timedelta(days=days * 6):
            break  # a backlog that never drains: report what the week did
    return _summary(jobs, busy_while_short, lost_gpu_s)


def _held(running: list[Job]) -> Held:
    teams: dict[str, int] = {}
    for job in running:
        teams[job.team] = teams.get(job.team, 0) + job.gpus
    return Held(by_team=teams, by_cluster={"pool": sum(teams.values())})


def _as_waiting(job: Job, now: datetime, scheme: Scheme) -> Waiting:
    first_s = scheme.preemption.min_runtime_s if scheme.backoff and scheme.preemption else 0.0
    return Waiting(
        job.id, job.team, "pool", job.gpus, job.priority, job.submitted,
        frozenset(job.preempted_by),
        borrow_backoff(job.preemptions, job.requeued_at, now, first_s),
    )  # fmt: skip


def _admit(
    waiting: list[Job], running: list[Job], limits: Limits, now: datetime, scheme: Scheme
) -> None:
    decision = admit([_as_waiting(j, now, scheme) for j in waiting], _held(running), limits)
    by_id = {j.id: j for j in waiting}
    for job_id in decision.admitted:
        job = by_id[job_id]
        waiting.remove(job)
        job.started, job.borrowing = now, job_id in decision.borrowing
        job.first_start = job.first_start or now
        running.append(job)


def _preempt(
    waiting: list[Job], running: list[Job], limits: Limits, now: datetime, scheme: Scheme
) -> None:
    """Victims for the first waiting jobs in line, unless GPUs are already being freed."""
    if any(j.stopping_until is not None for j in running):
        return  # one preemption at a time: the freed GPUs go to the job it was for
    line = sorted(waiting, key=lambda j: (-j.priority, j.submitted))[:5]
    candidates = [_as_running(j) for j in running]
    assert scheme.preemption is not None
    for job in line:
        chosen = choose_victims(
            _as_waiting(job, now, scheme), candidates, _held(running), limits, now,
            scheme.preemption,
        )  # fmt: skip
        if chosen is None:
            continue
        for victim in running:
            if victim.id in chosen.victims:
                grace = victim.save_s if scheme.graceful else 30.0
                victim.stopping_until = now + timedelta(seconds=grace)
                victim.preempted_by.add(job.id)
                victim.preemptions += 1
        return


def _as_running(job: Job) -> Running:
    assert job.started is not None
    return Running(
        job.id, job.team, "pool", job.gpus, job.priority, job.borrowing, job.started,
        job.saved_at,
    )  # fmt: skip


def _requeue(job: Job, graceful: bool) -> float:
    """Back to waiting at its original submit time; the GPU-seconds the stop cost."""
    assert job.stopping_until is not None
    stop_s = job.save_s if graceful else 30.0
    if graceful:
        job.saved_s = job.done_s  # it saved the step it reached
    redone = job.done_s - job.saved_s
    job.done_s = job.saved_s
    job.stopping_until, job.started, job.borrowing = None, None, False
    return job.gpus * (redone + stop_s)


def _summary(jobs: list[Job], busy: list[float], lost_gpu_s: float) -> dict[str, float]:
    waits = sorted(
        (j.first_start - j.submitted).total_seconds() / 60
        for j in jobs
        if j.priority == HIGH and j.first_start is not None
    )
    return {
        "utilisation": statistics.fmean(busy) if busy else 0.0,
        "high p50 min": _quantile(waits, 0.5),
        "high p95 min": _quantile(waits, 0.95),
        "lost GPU-h": lost_gpu_s / 3600,
        "preemptions/job": statistics.fmean(j.preemptions for j in jobs),
        "max preemptions": max(j.preemptions for j in jobs),
        "finished": sum(1 for j in jobs if j.finished is not None),
    }


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return values[min(int(q * len(values)), len(values) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--days", type=int, default=7)
    args = parser.parse_args()
    jobs = trace(args.seed, args.days)
    high = sum(1 for j in jobs if j.priority == HIGH)
    gpu_h = sum(j.gpus * j.work_s for j in jobs) / 3600
    print(f"trace: seed {args.seed}, {len(jobs)} jobs ({high} high priority), {gpu_h:,.0f}"
          f" GPU-hours of work, pool {sum(QUOTAS.values())} GPUs, quotas {QUOTAS}")  # fmt: skip
    columns = ("utilisation", "high p50 min", "high p95 min", "lost GPU-h", "preemptions/job",
               "max preemptions", "finished")  # fmt: skip
    print(f"{'policy':<22} " + " ".join(f"{c:>15}" for c in columns))
    for scheme in SCHEMES:
        copies = [Job(**{k: v for k, v in vars(j).items() if k != "preempted_by"}) for j in jobs]
        result = replay(copies, scheme, args.days)
        cells = [f"{result[c]:>15.3f}" if isinstance(result[c], float) else f"{result[c]:>15}"
                 for c in columns]  # fmt: skip
        print(f"{scheme.name:<22} " + " ".join(cells))


if __name__ == "__main__":
    main()
