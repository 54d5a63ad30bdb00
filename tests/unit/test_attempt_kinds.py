"""The kinds of attempt and the budgets they spend (service.core.attempt_kinds)."""

from __future__ import annotations

import pytest

from service.core.attempt_kinds import (
    BUDGETS,
    MAX_DISRUPTION_RETRIES,
    MAX_FAULT_RETRIES,
    MAX_STOP_RESUMES,
    AttemptKind,
    max_attempts_used,
    within_own_limit,
)


def test_every_kind_has_one_row_in_the_budget_table() -> None:
    assert set(BUDGETS) == set(AttemptKind)


def test_only_the_users_own_attempts_use_max_attempts() -> None:
    users = ["advisor", "escalation", "oom_retry"]
    theirs = ["disruption", "stop", "preemption", "replacement", "fault_retry", "resize"]
    assert max_attempts_used(users + theirs) == 3
    assert max_attempts_used(theirs * 5) == 0


@pytest.mark.parametrize(
    ("kind", "limit"),
    [
        (AttemptKind.DISRUPTION, MAX_DISRUPTION_RETRIES),
        (AttemptKind.STOP, MAX_STOP_RESUMES),
        (AttemptKind.FAULT_RETRY, MAX_FAULT_RETRIES),
    ],
)
def test_disruptions_stops_and_faults_end_at_their_own_limit(kind: AttemptKind, limit: int) -> None:
    before_last = ["advisor", "escalation"] + [kind.value] * (limit - 1)
    assert within_own_limit(before_last, kind)
    assert not within_own_limit([*before_last, kind.value], kind)


def test_one_kinds_attempts_spend_none_of_anothers_limit() -> None:
    disrupted = ["advisor"] + ["disruption"] * MAX_DISRUPTION_RETRIES
    assert not within_own_limit(disrupted, AttemptKind.DISRUPTION)
    assert within_own_limit(disrupted, AttemptKind.STOP)


@pytest.mark.parametrize(
    "kind",
    [AttemptKind.ESCALATION, AttemptKind.OOM_RETRY, AttemptKind.PREEMPTION,
     AttemptKind.REPLACEMENT],
)  # fmt: skip
def test_kinds_without_a_limit_of_their_own_are_never_refused_by_one(kind: AttemptKind) -> None:
    assert within_own_limit([kind.value] * 100, kind)


def test_the_stored_names_are_the_ones_migration_0014_wrote() -> None:
    assert [kind.value for kind in AttemptKind] == [
        "advisor", "escalation", "oom_retry", "disruption", "stop", "preemption", "replacement",
        "fault_retry", "resize",
    ]  # fmt: skip
