"""Re-placing a waiting ``cluster: auto`` job: it moves for a clear gain only, and not twice
in a row."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from service.core.advisor import advise
from service.core.placement import Option, plan_everywhere
from service.core.spec import JobSpec
from service.core.waiting_placement import (
    Hysteresis,
    finish_s,
    move_to,
    moved_words,
    settled_since,
)
from tests.unit.test_placement import A100_40, H100, SEVEN_B

RULE = Hysteresis()


def both(steps: int | None) -> tuple[Option, Option]:
    """The 7B job planned on the A100s and the H100s, both free (start now)."""
    spec = {**SEVEN_B, "training": {**SEVEN_B["training"], "steps": steps}}  # type: ignore[dict-item]
    a100, h100 = plan_everywhere(
        JobSpec.model_validate(spec), [A100_40, H100], advise, lambda _: ""
    )
    return a100, h100


def waiting(option: Option, start_in_s: float | None) -> Option:
    return replace(option, waits="cluster full", start_in_s=start_in_s)


def test_a_job_waiting_hours_moves_to_a_cluster_where_it_ends_clearly_earlier() -> None:
    a100, h100 = both(steps=20_000)
    here = waiting(h100, start_in_s=24 * 3600.0)  # its H100s are busy for a day
    there = move_to(here, [a100, here], RULE)

    assert there is not None and there.cluster == "a100-40"
    assert finish_s(there) == a100.duration_s  # it starts now there
    words = moved_words(here, there)
    assert words.startswith("re-placed on a100-40: expected to end in ")
    assert words.endswith(" on h100") and "instead of in " in words


def test_a_small_gain_does_not_move_it() -> None:
    a100, h100 = both(steps=20_000)
    assert a100.duration_s is not None and h100.duration_s is not None
    # the H100 frees up so late that the A100 ends 10% earlier: better, but inside the margin
    here = waiting(h100, start_in_s=a100.duration_s * 1.10 - h100.duration_s)
    stay = finish_s(here)
    assert stay is not None and stay - a100.duration_s >= RULE.min_gain_s  # minutes are enough
    assert move_to(here, [a100, here], RULE) is None
    # the same move, with the margin at 5%, goes ahead: it is the margin that kept it
    assert move_to(here, [a100, here], Hysteresis(min_gain=0.05)) is not None


def test_a_short_job_does_not_move_for_seconds() -> None:
    a100, h100 = both(steps=200)  # a few minutes on either
    assert a100.duration_s is not None and a100.duration_s < RULE.min_gain_s
    here = waiting(h100, start_in_s=a100.duration_s)  # ends far more than 20% later here
    stay = finish_s(here)
    assert stay is not None and (stay - a100.duration_s) / stay > RULE.min_gain
    assert move_to(here, [a100, here], RULE) is None  # but by less than ten minutes


def test_without_a_length_only_a_start_now_elsewhere_moves_a_job_of_unknown_start() -> None:
    a100, h100 = both(steps=None)
    here = waiting(h100, start_in_s=None)  # a job ahead of it has no length: start unknown
    there = move_to(here, [a100, here], RULE)
    assert there is not None and there.cluster == "a100-40"
    assert moved_words(here, there) == (
        "re-placed on a100-40: expected to start now instead of at a time not known on h100"
    )
    busy = waiting(a100, start_in_s=2 * 3600.0)  # the other cluster has a queue too
    assert move_to(here, [busy, here], RULE) is None


def test_where_it_is_already_the_best_choice_it_stays() -> None:
    a100, h100 = both(steps=20_000)
    assert move_to(h100, [a100, h100], RULE) is None
    assert move_to(waiting(a100, None), [waiting(a100, None)], RULE) is None  # nowhere else


def test_a_job_its_cluster_can_no_longer_admit_moves_to_one_that_can_whatever_the_gain() -> None:
    a100, _ = both(steps=20_000)
    capped = "the job needs 8 GPUs and zeropilot admits at most 4 on h100"
    here = Option("h100", ruled_out=capped)  # a cap lowered under it: it would wait for ever
    busy = waiting(a100, start_in_s=2 * 3600.0)  # the other cluster has a queue: no matter

    there = move_to(here, [busy, here], RULE)

    assert there is not None and there.cluster == "a100-40"
    assert (
        moved_words(here, there) == f"re-placed on a100-40: it can no longer run on h100 ({capped})"
    )
    assert move_to(here, [here], RULE) is None  # nowhere else can run it: it stays


def test_a_job_placed_within_the_settling_time_is_not_moved_again() -> None:
    now = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)
    since = settled_since(now, RULE)
    placed: dict[str, Any] = {"a minute ago": now - timedelta(minutes=1),
                              "an hour ago": now - timedelta(hours=1)}  # fmt: skip
    assert [name for name, at in placed.items() if at <= since] == ["an hour ago"]
