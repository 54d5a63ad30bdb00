"""Job spec validation: bad input names the field and the rule; good input round-trips."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from service.core.spec import JobSpec


def spec(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "tiny-gpt",
        "entrypoint": "train.py",
        "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 128},
        "training": {"sequence_length": 32, "global_batch_size": 8},
        "resources": {"nodes": 1, "gpus_per_node": 2},
    }
    for path, value in changes.items():
        node = base
        *parents, leaf = path.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return base


def error_of(raw: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(raw)
    return str(info.value)


def test_minimal_spec_gets_defaults() -> None:
    job = JobSpec.model_validate(spec())
    assert job.zero.stage == "auto"
    assert job.training.micro_batch_size == "auto"
    assert job.resources.cluster == "local"
    assert job.escalation.max_attempts == 4


def test_unknown_key_is_named() -> None:
    assert "training.sequence_lenght" in error_of(spec(training__sequence_lenght=3))


@pytest.mark.parametrize(
    "name", ["Tiny", "tiny_gpt", "-tiny", "tiny-", "a" * 41, "x;rm -rf /", "$(id)", ""]
)
def test_names_that_cannot_be_object_names_are_refused(name: str) -> None:
    assert "name" in error_of(spec(name=name))


def test_env_names_must_be_identifiers() -> None:
    assert "env" in error_of(spec(env={"BAD-NAME": "1"}))
    assert JobSpec.model_validate(spec(env={"GOOD_NAME": "$(not run)"})).env["GOOD_NAME"]


def test_heads_must_divide_hidden() -> None:
    assert "num_heads (5) must divide hidden_size (64)" in error_of(spec(model__num_heads=5))


def test_model_needs_shape_or_count() -> None:
    message = error_of(spec(model={"hidden_size": 64}))
    assert "model.parameters or the shape" in message
    JobSpec.model_validate(spec(model={"parameters": 7_000_000_000}))


@pytest.mark.parametrize("field", ["training__sequence_length", "resources__nodes"])
def test_sizes_must_be_positive(field: str) -> None:
    assert "greater than 0" in error_of(spec(**{field: 0}))


def test_global_batch_must_split_over_ranks() -> None:
    message = error_of(spec(training__global_batch_size=9))
    assert "global_batch_size (9) is not divisible by the data-parallel size (2" in message


def test_batch_identity_names_the_numbers() -> None:
    message = error_of(spec(training__micro_batch_size=2, training__gradient_accumulation_steps=3))
    assert "2 x 3 x 2 = 12 != global_batch_size 8" in message


def test_consistent_batch_numbers_pass() -> None:
    job = JobSpec.model_validate(
        spec(training__micro_batch_size=2, training__gradient_accumulation_steps=2)
    )
    assert job.training.global_batch_size == 8


def test_micro_batch_must_divide_per_rank_batch() -> None:
    assert "micro_batch_size (3) does not divide" in error_of(spec(training__micro_batch_size=3))


def test_offload_all_needs_stage_three() -> None:
    assert "needs stage 3" in error_of(spec(zero={"stage": 2, "offload": "all"}))
