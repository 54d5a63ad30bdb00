"""Preemption: reclaiming lent quota, priority within a team, the smallest set, no loops."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.core.admission import Held, Limits, Waiting, admit
from service.core.preemption import Policy, Running, borrow_backoff, choose_victims

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
QUOTAS = Limits(team_quota={"a": 4, "b": 4}, borrowing=True)  # a pool of 8 GPUs


def waiting(job_id: str, team: str, gpus: int, priority: int = 50, **extra: object) -> Waiting:
    return Waiting(job_id, team, "c", gpus, priority, NOW - timedelta(hours=1), **extra)  # type: ignore[arg-type]


def running(
    job_id: str,
    team: str,
    gpus: int = 1,
    priority: int = 50,
    borrowing: bool = False,
    minutes: float = 60,
    checkpoint_minutes_ago: float | None = None,
) -> Running:
    checkpoint = NOW - timedelta(minutes=checkpoint_minutes_ago) if checkpoint_minutes_ago else None
    return Running(
        job_id, team, "c", gpus, priority, borrowing, NOW - timedelta(minutes=minutes), checkpoint,
        400 if checkpoint else None,
    )  # fmt: skip


def held_by(jobs: list[Running]) -> Held:
    teams: dict[str, int] = {}
    for job in jobs:
        teams[job.team] = teams.get(job.team, 0) + job.gpus
    return Held(by_team=teams, by_cluster={"c": sum(teams.values())})


def test_idle_quota_is_lent_and_the_borrower_is_marked() -> None:
    jobs = [waiting(f"b{i}", "b", 1) for i in range(8)]  # team a has nothing to run
    decision = admit(jobs, Held(), QUOTAS)
    assert len(decision.admitted) == 8
    assert decision.borrowing == {"b4", "b5", "b6", "b7"}  # past b's 4-GPU quota


def test_borrowing_stops_where_the_pool_is_full_or_the_limit_says() -> None:
    limited = Limits(team_quota={"a": 4, "b": 4}, borrowing=True, team_borrow_limit={"b": 2})
    decision = admit([waiting(f"b{i}", "b", 1) for i in range(8)], Held(), limited)
    assert len(decision.admitted) == 6
    assert "its borrow limit is 2" in decision.waiting["b6"]
    full = admit([waiting("b9", "b", 1)], Held(by_team={"a": 3, "b": 5}), QUOTAS)
    assert "no idle GPUs are left to borrow (8 of 8 GPUs in use)" in full.waiting["b9"]


def test_the_owner_reclaims_the_borrowed_gpus_with_the_least_work_lost() -> None:
    jobs = [running(f"b{i}", "b") for i in range(4)]
    jobs += [
        running("b4", "b", borrowing=True, checkpoint_minutes_ago=50),
        running("b5", "b", borrowing=True, checkpoint_minutes_ago=2),
        running("b6", "b", borrowing=True, checkpoint_minutes_ago=30),
        running("b7", "b", borrowing=True, checkpoint_minutes_ago=5),
    ]
    job = waiting("a1", "a", 2)

    preemption = choose_victims(job, jobs, held_by(jobs), QUOTAS, NOW)

    assert preemption is not None
    assert preemption.victims == ("b5", "b7")  # borrowers that lose 2 and 5 minutes
    assert preemption.reasons["b5"] == (
        "preempted by job a1 (priority 50, team a): team a reclaims GPUs of its quota that team"
        " b borrows; a stop without a save would lose 2 min 0 s since its step-400 checkpoint"
    )


def test_a_job_inside_its_minimum_runtime_is_never_a_victim() -> None:
    jobs = [running(f"b{i}", "b", borrowing=i >= 4, minutes=5 if i >= 4 else 60) for i in range(8)]
    assert choose_victims(waiting("a1", "a", 2), jobs, held_by(jobs), QUOTAS, NOW) is None
    later = choose_victims(waiting("a1", "a", 2), jobs, held_by(jobs), QUOTAS, NOW, Policy(60))
    assert later is not None and len(later.victims) == 2


def test_a_requeued_job_does_not_preempt_its_preemptor_back() -> None:
    jobs = [running(f"a{i}", "a") for i in range(3)] + [running("a9", "a", priority=5)]
    jobs += [running(f"b{i}", "b") for i in range(4)]
    back = waiting("a5", "a", 1, priority=10, preempted_by=frozenset({"a9"}))
    walls = Limits(team_quota={"a": 4, "b": 4})
    assert choose_victims(back, jobs, held_by(jobs), walls, NOW) is None
    fresh = choose_victims(waiting("a6", "a", 1, priority=10), jobs, held_by(jobs), walls, NOW)
    assert fresh is not None and fresh.victims == ("a9",)  # any other job may stop a9


def test_higher_priority_stops_lower_priority_of_its_own_team_only() -> None:
    jobs = [running("a-low", "a", 4, priority=10), running("b-low", "b", 4, priority=10)]
    limits = Limits(team_quota={"a": 4, "b": 4})  # no borrowing: quotas are walls
    urgent = waiting("a-urgent", "a", 4, priority=90)

    preemption = choose_victims(urgent, jobs, held_by(jobs), limits, NOW)

    assert preemption is not None and preemption.victims == ("a-low",)
    assert "it has priority 10, below the job's" in preemption.reasons["a-low"]
    other = waiting("b-urgent", "b", 8, priority=90)  # over its own quota: b-low alone frees 4
    assert choose_victims(other, jobs, held_by(jobs), limits, NOW) is None


def test_across_teams_needs_the_operators_word() -> None:
    jobs = [running("b-low", "b", 8, priority=10)]
    limits = Limits(cluster_cap={"c": 8})
    urgent = waiting("a-urgent", "a", 8, priority=90)
    assert choose_victims(urgent, jobs, held_by(jobs), limits, NOW) is None
    allowed = choose_victims(urgent, jobs, held_by(jobs), limits, NOW, Policy(across_teams=True))
    assert allowed is not None and allowed.victims == ("b-low",)


def test_the_set_is_the_smallest_that_frees_enough() -> None:
    jobs = [running("big", "b", 4, borrowing=True, checkpoint_minutes_ago=1)]
    jobs += [running(f"s{i}", "b", 1, borrowing=True, checkpoint_minutes_ago=2) for i in range(4)]
    limits = Limits(cluster_cap={"c": 8}, team_quota={"a": 8, "b": 0}, borrowing=True)

    preemption = choose_victims(waiting("a1", "a", 4), jobs, held_by(jobs), limits, NOW)

    assert preemption is not None and preemption.victims == ("big",)


def test_the_owner_waits_while_its_quota_is_lent_and_says_so() -> None:
    held = Held(by_team={"b": 8})  # b borrows all of a's 4

    decision = admit([waiting("a1", "a", 2)], held, QUOTAS)

    assert decision.admitted == []
    assert decision.waiting["a1"] == (
        "team a is within its quota, but 8 of the pool's 8 GPUs are in use, some lent to other"
        " teams; this job needs 2"
    )


def test_a_team_without_a_quota_stands_outside_the_pool() -> None:
    limits = Limits(team_quota={"a": 4, "b": 4, "ops": None}, borrowing=True)
    held = Held(by_team={"ops": 16, "b": 4})  # ops has no limit and lends nothing

    decision = admit([waiting("b9", "b", 4)], held, limits)

    assert decision.admitted == ["b9"] and decision.borrowing == {"b9"}


def test_a_preempted_job_waits_longer_before_it_borrows_again_each_time() -> None:
    requeued = NOW - timedelta(minutes=5)
    waits = [borrow_backoff(n, requeued, requeued, 600) for n in range(1, 8)]
    minutes = [round((w - requeued).total_seconds() / 60) for w in waits if w is not None]
    assert minutes == [10, 20, 40, 80, 160, 160, 160]  # doubling, at most 16x
    assert borrow_backoff(1, requeued, NOW, 600) == requeued + timedelta(minutes=10)
    assert borrow_backoff(1, requeued, NOW + timedelta(minutes=6), 600) is None  # over
    assert borrow_backoff(0, None, NOW, 600) is None  # never preempted
    assert borrow_backoff(3, requeued, NOW, 0) is None  # preemption off: no back-off


def test_a_backed_off_job_starts_within_its_quota_but_borrows_and_stops_no_one() -> None:
    later = NOW + timedelta(minutes=15)
    own = waiting("b1", "b", 2, preempted_by=frozenset({"a1"}), borrow_after=later)
    over = waiting("b2", "b", 4, preempted_by=frozenset({"a1"}), borrow_after=later)
    decision = admit([own, over], Held(by_team={"b": 2}), QUOTAS)
    assert decision.admitted == ["b1"]  # 2 + 2 of b's 4
    assert decision.waiting["b2"].startswith("preempted 1x, it may borrow again from 2026-12-02")
    assert "within team b's 4-GPU quota it may start at once" in decision.waiting["b2"]

    # b holds its 4; a lower-priority job borrows 2 of the pool's last 4; b's 4 more would borrow
    jobs = [running("b0", "b", gpus=4), running("c1", "a", gpus=2, priority=10, borrowing=True)]
    urgent = {"priority": 90, "preempted_by": frozenset({"a9"})}
    backed_off = waiting("b3", "b", 4, borrow_after=later, **urgent)
    assert choose_victims(backed_off, jobs, held_by(jobs), QUOTAS, NOW) is None
    free = choose_victims(waiting("b3", "b", 4, **urgent), jobs, held_by(jobs), QUOTAS, NOW)
    assert free is not None and free.victims == ("c1",)  # the same job, its back-off over


def test_a_requeued_victim_goes_after_the_job_it_was_stopped_for() -> None:
    # Equal priority and usage: by submit time alone the victim would take its GPUs back first
    victim = waiting("b1", "b", 2, preempted_by=frozenset({"a1"}))
    preemptor = Waiting("a1", "a", "c", 2, 50, NOW)  # submitted after the victim
    capped = Limits(team_quota={"a": 4, "b": 4}, cluster_cap={"c": 2})

    first = admit([victim, preemptor], Held(), capped)
    assert first.admitted == ["a1"]  # the cap's 2 GPUs go to the preemptor
    assert first.waiting["b1"] == "cluster c has 2 of its 2 GPUs admitted; this job needs 2"
    room = Limits(team_quota={"a": 4, "b": 4}, cluster_cap={"c": 4})
    both = admit([victim, preemptor], Held(), room)
    assert both.admitted == ["a1", "b1"]  # room for both: the victim goes on as well
