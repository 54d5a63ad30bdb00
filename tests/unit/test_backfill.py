"""Backfill behind a job blocked by its cluster's cap: who may pass, and the reservation rule."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from service.core.admission import Held, Limits, Waiting, admit
from service.core.backfill import Margin, backfill, reserve
from service.core.forecast import Holding, Length

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
CAP = Limits(cluster_cap={"c": 2})
MARGIN = Margin(floor_s=5.0, share=0.25)


def waiting(job_id: str, gpus: int, minute: int, team: str = "ml") -> Waiting:
    return Waiting(job_id, team, "c", gpus, 50, NOW - timedelta(minutes=60 - minute))


def running(job_id: str, gpus: int, seconds_left: float) -> Holding:
    return Holding(job_id, "ml", "c", gpus, Length(int(seconds_left), 1.0), started_at=NOW)


def test_a_short_job_passes_the_blocked_one_and_a_long_or_unknown_one_does_not() -> None:
    """Cap 2, one GPU held for 100 s: the 2-GPU job is first in line and reserved at 100 s."""
    line = [waiting("big", 2, 0), waiting("long", 1, 1), waiting("short", 1, 2),
            waiting("unknown", 1, 3)]  # fmt: skip
    lengths = {"big": Length(50, 1.0), "long": Length(90, 1.0), "short": Length(20, 1.0)}
    held = Held(by_team={"ml": 1}, by_cluster={"c": 1})
    decision = admit(line, held, CAP)
    assert decision.admitted == [] and decision.blocked == {"c": "big"}

    passed = backfill(line, decision, lengths, [running("r", 1, 100)], held, CAP, NOW, MARGIN)

    # long: 90 s + its 22.5 s margin ends after 100 s; short: 20 + 5 s ends before it
    assert passed.admitted == ["short"]
    assert passed.reasons["short"] == (
        "backfilled: predicted to end by 12:00:25 UTC with its margin, before job big's"
        " reserved start at 12:01:40 UTC"
    )
    assert passed.reservations["c"].at == NOW + timedelta(seconds=100)


def test_a_job_may_hold_past_the_reservation_only_on_gpus_the_first_job_leaves_free() -> None:
    """Cap 4, a 2-GPU holder ending at 50 s and a 1-GPU one at 80 s, 1 GPU free: the 2-GPU job
    is reserved at 50 s, when one GPU more than it needs is free; a long 1-GPU job may take it
    now, and the next finds none free."""
    limits = Limits(cluster_cap={"c": 4})
    line = [waiting("big", 2, 0), waiting("long-a", 1, 1), waiting("long-b", 1, 2)]
    lengths = {name: Length(1000, 1.0) for name in ("big", "long-a", "long-b")}
    holders = [running("r1", 2, 50), running("r2", 1, 80)]
    held = Held(by_team={"ml": 3}, by_cluster={"c": 3})

    passed = backfill(line, admit(line, held, limits), lengths, holders, held, limits, NOW, MARGIN)

    assert passed.admitted == ["long-a"]
    assert passed.reasons["long-a"] == (
        "backfilled: it uses only GPUs that job big's reserved start at 12:00:50 UTC leaves free"
    )


def test_no_one_passes_a_reservation_that_rests_on_a_job_of_unknown_length() -> None:
    line = [waiting("big", 2, 0), waiting("short", 1, 1)]
    unknown = Holding("r", "ml", "c", 1, Length(), started_at=NOW)
    held = Held(by_team={"ml": 1}, by_cluster={"c": 1})

    passed = backfill(line, admit(line, held, CAP), {"short": Length(1, 1.0)}, [unknown], held,
                      CAP, NOW, MARGIN)  # fmt: skip

    assert passed.admitted == [] and passed.reservations == {}


def test_the_first_jobs_reserved_start_never_moves_later_because_of_a_backfilled_job() -> None:
    """Random clusters, holders and lines: with every backfilled job holding its GPUs for its
    predicted run, the first job's reserved start is never later than before."""
    rng = random.Random(36)
    for _ in range(500):
        cap = rng.randint(2, 16)
        limits = Limits(cluster_cap={"c": cap})
        holders, held_gpus = [], 0
        while held_gpus < cap - 1 and rng.random() < 0.8:
            gpus = rng.randint(1, cap - 1 - held_gpus)
            holders.append(running(f"r{len(holders)}", gpus, rng.uniform(1, 500)))
            held_gpus += gpus
        line = [waiting(f"w{i}", rng.randint(1, cap), i) for i in range(rng.randint(1, 8))]
        lengths = {job.job_id: Length(rng.randint(1, 600), 1.0) for job in line}
        held = Held(by_team={"ml": held_gpus}, by_cluster={"c": held_gpus})
        decision = admit(line, held, limits)
        if "c" not in decision.blocked:
            continue
        passed = backfill(line, decision, lengths, holders, held, limits, NOW, Margin(0.0, 0.0))
        first = next(job for job in line if job.job_id == decision.blocked["c"])
        started = [job for job in line if job.job_id in {*decision.admitted, *passed.admitted}]
        before = reserve(first, [*holders, *_as_holders(decision.admitted, line, lengths)],
                         _with(held, decision.admitted, line), limits, NOW)  # fmt: skip
        after = reserve(first, [*holders, *_as_holders([j.job_id for j in started], line, lengths)],
                        _with(held, [j.job_id for j in started], line), limits, NOW)  # fmt: skip
        assert before is not None and after is not None
        assert after.at <= before.at


def _as_holders(ids: list[str], line: list[Waiting], lengths: dict[str, Length]) -> list[Holding]:
    return [Holding(j.job_id, j.team, j.cluster, j.gpus, lengths[j.job_id], started_at=NOW)
            for j in line if j.job_id in ids]  # fmt: skip


def _with(held: Held, ids: list[str], line: list[Waiting]) -> Held:
    gpus = sum(job.gpus for job in line if job.job_id in ids)
    return Held({"ml": held.by_team["ml"] + gpus}, {"c": held.by_cluster["c"] + gpus})
