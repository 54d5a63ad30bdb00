"""When a running attempt counts as hung (service.core.progress)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.core.progress import HangRule, Progress, hang

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
RULE = HangRule(floor_s=300, factor=10, first_step_s=1800)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def stepped(
    step_s: float | None, last_at: float, basis: str = "measured over 40 steps"
) -> Progress:
    return Progress(T0, 40, at(last_at), step_s, basis)


def test_before_its_first_step_it_has_the_first_step_allowance() -> None:
    starting = Progress(T0, None, None, 2.0, "predicted")
    assert hang(starting, RULE, at(1800)) is None
    assert hang(starting, RULE, at(1801)) == (
        "no step reported in the 1801 s since it started (allowed 1800 s)"
    )


def test_a_slow_job_may_take_factor_times_its_own_step() -> None:
    slow = stepped(60.0, last_at=100)  # 10 x 60 s = 600 s, over the floor
    assert hang(slow, RULE, at(700)) is None
    assert hang(slow, RULE, at(701)) == (
        "no step for 601 s after step 40 (allowed 600 s: 10 x a 60.00 s step"
        " (measured over 40 steps))"
    )


def test_a_fast_job_is_held_to_the_floor_never_less() -> None:
    fast = stepped(0.5, last_at=0)  # 10 x 0.5 s = 5 s: the floor (300 s) decides
    assert hang(fast, RULE, at(300)) is None
    assert "allowed 300 s: the floor, over 10 x a 0.50 s step" in (hang(fast, RULE, at(301)) or "")


def test_without_any_step_time_the_floor_decides() -> None:
    unknown = stepped(None, last_at=0, basis="")
    assert hang(unknown, RULE, at(301)) == (
        "no step for 301 s after step 40 (allowed 300 s: the floor; no step time known)"
    )
