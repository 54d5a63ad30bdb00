"""The goodput timeline's rules where the database test's timeline does not reach: a hang, an
attempt whose work nobody resumed, a window that cuts attempts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.core.goodput import AttemptRun, Cause, Save, Step, job_segments, tally

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run(number: int, start: float, end: float, **fields: object) -> AttemptRun:
    values: dict[str, object] = {
        "number": number, "gpus": 4, "start": at(start), "end": at(end), "finished_ok": False,
        "stopped": False, "hung": False, "resumed_from": None, "first": None, "last": None,
    }  # fmt: skip
    return AttemptRun(**{**values, **fields})  # type: ignore[arg-type]


def test_a_hang_counts_from_the_last_step_to_its_stop() -> None:
    hung = run(
        1, 0, 100, hung=True, first=Step(1, at(11), 1.0), last=Step(20, at(30), 1.0),
        saves=[Save(20, "/c/20", at(35), 5.0)],
    )  # fmt: skip
    after = run(2, 200, 210, resumed_from="/c/20", finished_ok=True)
    counted = tally(job_segments([hung, after]))
    assert counted.by_cause[Cause.STARTUP] == 4 * 10 + 4 * 10  # the second never stepped
    assert counted.by_cause[Cause.PRODUCTIVE] == 4 * 20
    assert counted.by_cause[Cause.CHECKPOINTING] == 4 * 5
    assert counted.by_cause[Cause.HANG] == 4 * 65  # 35 s to 100 s: no step, held


def test_work_of_an_attempt_nobody_resumed_is_redone() -> None:
    first = run(
        1,
        0,
        60,
        first=Step(1, at(1)),
        last=Step(50, at(50)),
        saves=[Save(40, "/c/40", at(45), 2.0)],
    )
    fresh = run(2, 100, 150, finished_ok=True, first=Step(1, at(101)), last=Step(50, at(150)))
    counted = tally(job_segments([first, fresh]))  # attempt 2 started over: nothing kept of 1
    assert counted.by_cause[Cause.REDONE] == 4 * 49  # its first step at 1 s to its last at 50 s
    assert counted.by_cause[Cause.PRODUCTIVE] == 4 * 49


def test_a_window_counts_only_its_part() -> None:
    done = run(1, 0, 100, finished_ok=True, first=Step(1, at(10)), last=Step(90, at(100)))
    counted = tally(job_segments([done]), since=at(50), until=at(80))
    assert counted.held == 4 * 30 and counted.productive == 4 * 30


def test_a_running_attempt_counts_up_to_its_latest_report() -> None:
    stepping = run(
        1, 0, 100, running=True, finished_ok=True, first=Step(1, at(10)), last=Step(50, at(60))
    )
    starting = run(1, 0, 100, running=True, finished_ok=True)
    assert tally(job_segments([stepping])).held == 4 * 60  # not the 40 s since: unknown yet
    assert tally(job_segments([stepping])).productive == 4 * 50
    assert tally(job_segments([starting])).by_cause[Cause.STARTUP] == 4 * 100
