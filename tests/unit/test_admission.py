"""Admission under team quotas, cluster caps, priorities and fair share."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from service.core.admission import (
    Cap,
    Decision,
    Held,
    Limits,
    Waiting,
    admit,
    bounded_cap,
    never_fits,
)

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def job(
    job_id: str, team: str, gpus: int = 8, priority: int = 50, minute: int = 0, cluster: str = "a"
) -> Waiting:
    return Waiting(job_id, team, cluster, gpus, priority, T0 + timedelta(minutes=minute))


def test_without_limits_everything_is_admitted_oldest_first() -> None:
    decision = admit([job("b", "ml", minute=2), job("a", "ml", minute=1)], Held(), Limits())

    assert decision.admitted == ["a", "b"]
    assert decision.waiting == {}


def test_a_team_over_its_quota_waits_and_says_why() -> None:
    held = Held(by_team={"ml": 8})

    decision = admit([job("j1", "ml", gpus=8)], held, Limits(team_quota={"ml": 16}))
    assert decision.admitted == ["j1"]

    decision = admit([job("j2", "ml", gpus=16)], held, Limits(team_quota={"ml": 16}))
    assert decision.admitted == []
    assert decision.waiting == {"j2": "team ml holds 8 of its 16-GPU quota; this job needs 16"}


def test_a_team_at_its_quota_does_not_hold_up_other_teams() -> None:
    waiting = [job("ml-1", "ml", minute=0), job("cv-1", "cv", minute=1)]

    decision = admit(waiting, Held(by_team={"ml": 16}), Limits(team_quota={"ml": 16}))

    assert decision.admitted == ["cv-1"]
    assert set(decision.waiting) == {"ml-1"}


def test_higher_priority_goes_first_even_when_younger() -> None:
    waiting = [job("old", "ml", minute=0), job("urgent", "ml", priority=90, minute=5)]

    decision = admit(waiting, Held(), Limits(cluster_cap={"a": 8}))

    assert decision.admitted == ["urgent"]
    assert "cluster a has 8 of its 8 GPUs admitted" in decision.waiting["old"]


def test_fair_share_alternates_between_teams_with_equal_shares() -> None:
    # ml submitted all of its jobs first; cv's still get every other slot.
    waiting = [job(f"ml-{i}", "ml", minute=i) for i in range(3)]
    waiting += [job(f"cv-{i}", "cv", minute=10 + i) for i in range(3)]

    decision = admit(waiting, Held(), Limits(cluster_cap={"a": 32}))

    assert decision.admitted == ["ml-0", "cv-0", "ml-1", "cv-1"]


def test_a_larger_share_gets_proportionally_more() -> None:
    waiting = [job(f"ml-{i}", "ml", minute=i) for i in range(4)]
    waiting += [job(f"cv-{i}", "cv", minute=i) for i in range(4)]
    limits = Limits(team_share={"ml": 3, "cv": 1}, cluster_cap={"a": 32})

    decision = admit(waiting, Held(), limits)

    assert sorted(decision.admitted) == ["cv-0", "ml-0", "ml-1", "ml-2"]


def test_fair_share_counts_what_a_team_already_holds() -> None:
    waiting = [job("ml-new", "ml", minute=0), job("cv-new", "cv", minute=5)]

    held = Held(by_team={"ml": 24}, by_cluster={"a": 24})

    decision = admit(waiting, held, Limits(cluster_cap={"a": 32}))

    assert decision.admitted == ["cv-new"]


def test_a_job_waiting_for_the_cap_is_not_overtaken_by_smaller_ones_on_that_cluster() -> None:
    waiting = [
        job("big", "ml", gpus=16, minute=0),
        job("small", "cv", gpus=4, minute=1),
        job("elsewhere", "cv", gpus=4, minute=2, cluster="b"),
    ]

    decision = admit(waiting, Held(by_cluster={"a": 24}), Limits(cluster_cap={"a": 32}))

    assert decision.admitted == ["elsewhere"]
    assert decision.waiting["small"] == "behind an earlier job waiting for cluster a"


def test_jobs_bigger_than_a_whole_limit_are_named_at_submission() -> None:
    limits = Limits(team_quota={"ml": 8}, cluster_cap={"a": 64})

    assert never_fits(16, "ml", "a", limits) == "the job needs 16 GPUs and team ml's quota is 8"
    assert never_fits(128, "cv", "a", limits) == (
        "the job needs 128 GPUs and zeropilot admits at most 64 on a"
    )
    assert never_fits(8, "ml", "a", limits) is None


def test_admission_decides_as_one_job_at_a_time_over_everything_waiting() -> None:
    # The rules as first written: each step takes the best of all waiting jobs.
    rng = random.Random(11)
    for _ in range(300):
        teams = [f"t{i}" for i in range(rng.randint(1, 4))]
        waiting = [
            job(f"j{i}", rng.choice(teams), gpus=rng.choice([1, 2, 4, 8]),
                priority=rng.choice([10, 50, 90]), minute=rng.randint(0, 30),
                cluster=rng.choice(["a", "b"]))
            for i in range(rng.randint(0, 25))
        ]  # fmt: skip
        held = Held(by_team={t: rng.choice([0, 4, 8]) for t in teams}, by_cluster={"a": 8})
        limits = Limits(
            team_quota={t: rng.choice([None, 8, 16, 32]) for t in teams},
            team_share={t: rng.randint(1, 3) for t in teams},
            cluster_cap={"a": rng.choice([None, 16, 32]), "b": rng.choice([None, 24])},
        )

        assert admit(waiting, held, limits) == one_at_a_time(waiting, held, limits)


def one_at_a_time(waiting: list[Waiting], held: Held, limits: Limits) -> Decision:
    by_team, by_cluster = dict(held.by_team), dict(held.by_cluster)
    left, admitted, reasons, blocked = list(waiting), [], {}, set()
    while left:
        best = min(
            left,
            key=lambda j: (
                -j.priority,
                by_team.get(j.team, 0) / max(limits.team_share.get(j.team, 1), 1),
                j.submitted_at,
                j.job_id,
            ),
        )
        left.remove(best)
        quota, cap = limits.team_quota.get(best.team), limits.cluster_cap.get(best.cluster)
        team_held, cluster_held = by_team.get(best.team, 0), by_cluster.get(best.cluster, 0)
        if best.cluster in blocked:
            reasons[best.job_id] = f"behind an earlier job waiting for cluster {best.cluster}"
        elif quota is not None and team_held + best.gpus > quota:
            reasons[best.job_id] = (
                f"team {best.team} holds {team_held} of its {quota}-GPU quota; "
                f"this job needs {best.gpus}"
            )
        elif cap is not None and cluster_held + best.gpus > cap:
            reasons[best.job_id] = (
                f"cluster {best.cluster} has {cluster_held} of its {cap} GPUs admitted; "
                f"this job needs {best.gpus}"
            )
            blocked.add(best.cluster)
        else:
            admitted.append(best.job_id)
            by_team[best.team] = team_held + best.gpus
            by_cluster[best.cluster] = cluster_held + best.gpus
    return Decision(admitted, reasons)


QUOTA = "namespace quota ml/gpus: requests.nvidia.com/gpu=16"


def test_a_cluster_limit_lower_than_max_gpus_caps_the_cluster_and_is_named() -> None:
    assert bounded_cap(32, 16, QUOTA) == Cap(16, QUOTA)
    assert bounded_cap(None, 16, QUOTA) == Cap(16, QUOTA)
    assert bounded_cap(8, 16, QUOTA) == Cap(8)  # the profile's own cap is the tighter
    assert bounded_cap(16, 16, QUOTA) == Cap(16)  # a tie: zeropilot's own setting says
    assert bounded_cap(8, None, "") == Cap(8)

    limits = Limits.of_caps({"a": Cap(16, QUOTA)})
    decision = admit([job("j1", "ml", gpus=16), job("j2", "ml", gpus=16, minute=1)], Held(), limits)
    assert decision.admitted == ["j1"]
    assert decision.waiting["j2"] == (
        f"cluster a has 16 of its 16 GPUs admitted ({QUOTA}); this job needs 16"
    )
    assert never_fits(24, "ml", "a", limits) == (
        f"the job needs 24 GPUs and zeropilot admits at most 16 on a ({QUOTA})"
    )


def test_a_job_larger_than_the_whole_cap_waits_without_holding_back_the_jobs_behind_it() -> None:
    # e.g. stored before the namespace's quota was lowered to 8 under it
    waiting = [job("big", "ml", gpus=16, minute=0), job("small", "cv", gpus=8, minute=1)]
    decision = admit(waiting, Held(), Limits.of_caps({"a": Cap(8, QUOTA)}))
    assert decision.admitted == ["small"]
    assert decision.waiting["big"] == (
        f"the job needs 16 GPUs and zeropilot admits at most 8 on a ({QUOTA}); it waits for"
        " that limit to be raised, and the jobs behind it go on"
    )
