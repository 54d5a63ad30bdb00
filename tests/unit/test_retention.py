"""The retention policy: which checkpoints stay, each rule on its own and the ones never broken."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.core.retention import Retention, Saved, missing_deepspeed_files, to_delete
from service.core.spec import CheckpointSpec


def saves(
    steps: range, incomplete: frozenset[int] = frozenset(), metric: dict[int, float] | None = None
) -> list[Saved]:
    metric = metric or {}
    return [
        Saved(s, s, f"/c/checkpoint-{s}", complete=s not in incomplete, metric=metric.get(s))
        for s in steps
    ]


def kept(saved: list[Saved], policy: Retention, pinned: tuple[str, ...] = ()) -> list[int]:
    doomed = to_delete(saved, policy, pinned)
    return [c.step for c in saved if c.id not in doomed]


def test_keep_last_two_of_ten_leaves_the_newest_two() -> None:
    assert kept(saves(range(1, 11)), Retention(keep_last=2)) == [9, 10]


def test_keep_every_steps_keeps_a_permanent_one_every_n_steps() -> None:
    policy = Retention(keep_last=2, keep_every_steps=4)
    assert kept(saves(range(1, 11)), policy) == [4, 8, 9, 10]


def test_keep_best_keeps_the_best_by_the_metric_in_its_mode() -> None:
    losses = {s: abs(s - 3) + 1.0 for s in range(1, 11)}  # best (lowest) at step 3
    assert kept(saves(range(1, 11), metric=losses), Retention(1, None, "loss", "min")) == [3, 10]
    assert kept(saves(range(1, 11), metric=losses), Retention(1, None, "acc", "max")) == [10]


def test_a_checkpoint_an_attempt_resumed_from_is_never_deleted() -> None:
    assert kept(saves(range(1, 11)), Retention(keep_last=1), ("/c/checkpoint-2",)) == [2, 10]


def test_an_incomplete_checkpoint_is_not_the_newest_and_the_newest_complete_stays() -> None:
    saved = saves(range(1, 6), incomplete=frozenset({4, 5}))
    # Step 3 is the newest complete: kept, though keep_last 1 would otherwise keep only step 5.
    assert kept(saved, Retention(keep_last=1)) == [3, 4, 5]
    doomed = to_delete(saves(range(1, 6), incomplete=frozenset({2})), Retention(keep_last=2), ())
    assert doomed[2] == "incomplete, older than the newest complete (step 5)"
    assert doomed[1] == "not kept by keep_last 2"


def test_deepspeed_needs_every_ranks_files_for_its_stage() -> None:
    zero2 = ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    assert missing_deepspeed_files(zero2, stage=2, world_size=2) == [
        "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    ]
    assert missing_deepspeed_files(zero2, stage=2, world_size=1) == []
    assert missing_deepspeed_files(["mp_rank_00_model_states.pt"], stage=0, world_size=8) == []
    zero3 = [
        f"zero_pp_rank_{r}_mp_rank_00_{k}_states.pt" for r in (0, 1) for k in ("model", "optim")
    ]
    assert missing_deepspeed_files(zero3, stage=3, world_size=2) == []
    assert missing_deepspeed_files(zero3[:3], stage=3, world_size=2) == [
        "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    ]
    bf16 = ["mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    assert missing_deepspeed_files(bf16, stage=1, world_size=1) == []


def test_the_spec_defaults_to_keep_last_2_and_refuses_nonsense() -> None:
    assert CheckpointSpec().keep_last == 2
    with pytest.raises(ValidationError, match="keep_last"):
        CheckpointSpec(keep_last=0)
    with pytest.raises(ValidationError, match="mode"):
        CheckpointSpec.model_validate({"keep_best": {"metric": "loss", "mode": "lowest"}})
