"""Borrowed and lent GPUs per team, as the teams page and /metrics show them."""

from __future__ import annotations

from service.core.sharing import TeamSharing, sharing


def test_a_borrower_holds_past_its_quota_and_the_idle_team_lends_it() -> None:
    shown = sharing({"speech": 6}, {"vision": 4, "speech": 4})
    assert shown["speech"] == TeamSharing(nominal=4, held=6, borrowed=2, lent=0)
    assert shown["vision"] == TeamSharing(nominal=4, held=0, borrowed=0, lent=2)


def test_lent_gpus_split_by_idle_quota_and_add_up_to_the_borrowed_ones() -> None:
    # nlp borrows 3; vision leaves 4 idle, speech 2: 2 and 1 of the 3 in whole GPUs
    shown = sharing({"nlp": 5, "speech": 2}, {"vision": 4, "speech": 4, "nlp": 2})
    assert {team: s.lent for team, s in shown.items()} == {"vision": 2, "speech": 1, "nlp": 0}
    assert sum(s.lent for s in shown.values()) == sum(s.borrowed for s in shown.values()) == 3


def test_an_even_split_is_the_same_every_time() -> None:
    shown = sharing({"nlp": 3}, {"b": 2, "a": 2, "nlp": 2})
    assert (shown["a"].lent, shown["b"].lent) == (1, 0)  # one GPU, ties broken by name


def test_a_team_without_a_quota_neither_borrows_nor_lends() -> None:
    shown = sharing({"ops": 16, "speech": 6}, {"ops": None, "speech": 4, "vision": 4})
    assert shown["ops"] == TeamSharing(nominal=None, held=16, borrowed=0, lent=0)
    assert shown["vision"].lent == 2


def test_borrowing_past_every_quota_under_a_cluster_cap_is_lent_by_no_one() -> None:
    # a cluster cap of 16 lets speech run 12 while vision's 4 are idle: 4 lent, 8 from the cap
    shown = sharing({"speech": 16}, {"speech": 4, "vision": 4})
    assert (shown["speech"].borrowed, shown["vision"].lent) == (12, 4)
