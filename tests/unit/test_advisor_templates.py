"""The ds_templates package: the fragments the advisor's configs are made of."""

from __future__ import annotations

from typing import Any

import pytest

import ds_templates


def test_each_stage_template_carries_the_articles_fields() -> None:
    zero3 = ds_templates.compose(3, False, False, "bf16")["zero_optimization"]
    zero2 = ds_templates.compose(2, False, False, "bf16")["zero_optimization"]

    assert zero2["reduce_scatter"] and zero2["overlap_comm"] and zero2["contiguous_gradients"]
    assert {
        "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold",
        "stage3_max_live_parameters",
        "stage3_gather_16bit_weights_on_model_save",
    } <= set(zero3)


def test_offload_and_precision_fragments_compose() -> None:
    config = ds_templates.compose(3, True, True, "fp16")

    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert config["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert config["fp16"]["loss_scale"] == 0  # dynamic loss scaling
    assert "bf16" not in config


def test_compose_returns_a_fresh_copy() -> None:
    first = ds_templates.compose(1, False, False, "bf16")
    first["zero_optimization"]["stage"] = 99

    assert ds_templates.compose(1, False, False, "bf16")["zero_optimization"]["stage"] == 1


@pytest.mark.parametrize(
    ("stage", "optimizer", "param"), [(0, True, False), (2, True, True), (4, False, False)]
)
def test_impossible_combinations_are_refused(stage: int, optimizer: bool, param: bool) -> None:
    with pytest.raises(ValueError):
        ds_templates.compose(stage, optimizer, param, "bf16")


def test_deep_merge_merges_dicts_and_replaces_the_rest() -> None:
    base: dict[str, Any] = {
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 5},
        "steps_per_print": 1,
    }
    merged = ds_templates.deep_merge(
        base, {"zero_optimization": {"reduce_bucket_size": 7}, "steps_per_print": 10}
    )

    assert merged == {
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 7},
        "steps_per_print": 10,
    }
    assert base["zero_optimization"]["reduce_bucket_size"] == 5
