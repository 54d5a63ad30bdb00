"""Predicted starts and ends of waiting jobs, from known running jobs and their steps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from service.core.admission import Held, Limits, Waiting
from service.core.forecast import Holding, Length, Progress, forecast, predicted_end

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def waiting(job_id: str, gpus: int, minute: int = 0, team: str = "ml") -> Waiting:
    return Waiting(job_id, team, "c", gpus, 50, NOW - timedelta(minutes=60 - minute))


def running(
    job_id: str, gpus: int, steps: int | None, step_s: float | None = 1.0,
    progress: Progress | None = None, team: str = "ml", **length: float,
) -> Holding:  # fmt: skip
    """A job that began running 100 s ago."""
    return Holding(job_id, team, "c", gpus, Length(steps, step_s, **length), at(-100), progress)


def test_a_running_job_ends_after_its_steps_left_at_its_measured_step_time() -> None:
    # Steps 10 and 50 reported 80 s apart: 2 s a step measured (the plan said 1 s); 50 left.
    progress = Progress(10, at(-90), 50, at(-10))

    end_s, basis = predicted_end(running("r", 2, 100, 1.0, progress), NOW)

    assert end_s == pytest.approx(-10 + 50 * 2.0)  # from the last report, not from now
    assert basis == "50 steps left at 2 s (measured)"


def test_without_reports_the_plan_and_without_steps_the_time_limit_give_the_end() -> None:
    planned = running("r", 2, 300, 0.5)
    assert predicted_end(planned, NOW) == (50.0, "300 steps left at 0.5 s (planned)")
    limited = running("r", 2, None, None, time_limit_s=600)
    assert predicted_end(limited, NOW) == (500.0, "its time limit, 600 s")  # started 100 s ago
    assert predicted_end(running("r", 2, None, None), NOW)[0] == float("inf")


def test_each_waiting_job_starts_when_the_jobs_ahead_and_the_holders_free_its_gpus() -> None:
    """Cap 8: a 4-GPU job ends in 90 s and a 4-GPU job in 300 s. In line: 6 GPUs (60 s long),
    2 GPUs (30 s), 8 GPUs (length unknown), then 1 GPU."""
    holding = [
        running("short", 4, 100, 1.0, Progress(0, at(-100), 10, at(-90))),  # 90 left at 1 s
        running("long", 4, 400, 1.0),  # no report yet: 400 s from its start 100 s ago
    ]
    line = [waiting("six", 6), waiting("two", 2, 1), waiting("eight", 8, 2), waiting("one", 1, 3),
            waiting("unknown-too", 1, 4)]  # fmt: skip
    lengths = {"six": Length(60, 1.0), "two": Length(30, 1.0), "one": Length(10, 1.0)}
    limits = Limits(cluster_cap={"c": 8})

    predicted = forecast(line, [j.job_id for j in line], lengths, holding,
                         Held(by_cluster={"c": 8}), limits, NOW)  # fmt: skip

    six, two, eight, one = (predicted[name] for name in ("six", "two", "eight", "one"))
    assert (six.start_at, six.end_at) == (at(300), at(360))  # needs both holders' GPUs
    assert six.basis.startswith("start: cluster c's 8-GPU cap frees enough when job long ends")
    assert (two.start_at, two.end_at) == (at(300), at(330))  # beside it, never before it
    assert (eight.start_at, eight.end_at) == (at(360), None)  # its length is unknown
    assert eight.basis.endswith("run: its length is not known (no training.steps, no time limit)")
    assert (one.start_at, one.end_at) == (None, None)  # behind a job that never ends, known
    assert one.basis == "start not known: it waits for a job of unknown length"
    assert predicted["unknown-too"].start_at is None  # behind one whose start is not known


def test_a_team_quota_and_a_cluster_cap_both_hold_a_job_until_the_later_frees() -> None:
    holding = [running("mine", 2, 50, team="ml"), running("theirs", 2, 200, team="cv")]
    line = [waiting("next", 2)]
    limits = Limits(team_quota={"ml": 2}, cluster_cap={"c": 4})
    held = Held(by_team={"ml": 2, "cv": 2}, by_cluster={"c": 4})

    predicted = forecast(line, ["next"], {"next": Length(10, 1.0)}, holding, held, limits, NOW)

    # The quota frees at -100 + 50 (now: past its end, so now); the cap needs one of them: now.
    assert predicted["next"].start_at == NOW
    assert predicted["next"].end_at == at(10)


def test_a_job_larger_than_a_whole_limit_never_starts_and_holds_no_one_back() -> None:
    line = [waiting("huge", 16), waiting("small", 1, 1)]
    predicted = forecast(line, ["huge", "small"], {}, [], Held(), Limits(cluster_cap={"c": 8}), NOW)

    assert predicted["huge"].start_at is None
    assert predicted["small"].start_at == NOW
