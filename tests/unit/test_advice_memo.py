"""A sweep's jobs, alike but for name and arguments, are planned once."""

from __future__ import annotations

from typing import Any

from service.core.advice_memo import advise_once
from service.core.advisor import advise
from service.core.clusters import LOCAL_PROFILE
from service.core.spec import JobSpec

SPEC: dict[str, Any] = {
    "name": "sweep-0",
    "entrypoint": "train.py",
    "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 128},
    "training": {"sequence_length": 32, "global_batch_size": 8, "precision": "fp32"},
    "resources": {"cluster": "local", "nodes": 1, "gpus_per_node": 2},
}


def spec(**changes: Any) -> JobSpec:
    return JobSpec.model_validate({**SPEC, **changes})


def test_jobs_that_differ_only_in_what_the_advisor_ignores_share_one_plan() -> None:
    first = advise_once(spec(), LOCAL_PROFILE)
    again = advise_once(spec(name="sweep-1", args=["--lr", "0.1"], priority=90), LOCAL_PROFILE)

    assert again is first
    assert first == advise(spec(), LOCAL_PROFILE)


def test_a_different_model_or_cluster_is_planned_anew() -> None:
    base = advise_once(spec(), LOCAL_PROFILE)
    bigger = spec(model={**SPEC["model"], "num_layers": 8})
    other_cluster = LOCAL_PROFILE.model_copy(update={"cpu_memory_gib": 1})

    assert advise_once(bigger, LOCAL_PROFILE) == advise(bigger, LOCAL_PROFILE)
    assert advise_once(bigger, LOCAL_PROFILE) is not base
    assert advise_once(spec(), other_cluster) is not base
