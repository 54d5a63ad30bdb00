"""The grace of a stop: the spec's, else sized from the job's measured saves, else the default."""

from __future__ import annotations

from service.core.stopping import DEFAULT_GRACE_S, MAX_GRACE_S, stop_grace


def test_the_specs_grace_wins() -> None:
    grace = stop_grace(120, [400.0])
    assert grace.seconds == 120
    assert grace.why == "120 s, the spec's checkpoint.grace_s"


def test_without_a_measured_save_the_default_holds() -> None:
    grace = stop_grace(None, [])
    assert grace.seconds == DEFAULT_GRACE_S
    assert "no save of this job measured yet" in grace.why


def test_a_slow_save_stretches_the_grace_and_says_why() -> None:
    grace = stop_grace(None, [12.0, 95.5, 40.0])
    assert grace.seconds == 2 * 95.5 + 10  # twice the slowest save, plus the step in progress
    assert grace.why == "201 s: 2 x the slowest of its 3 saves (95.5 s) + 10 s, at least 30 s"


def test_quick_saves_keep_the_default_and_a_huge_one_is_capped() -> None:
    assert stop_grace(None, [0.4]).seconds == DEFAULT_GRACE_S
    assert stop_grace(None, [86_400.0]).seconds == MAX_GRACE_S
