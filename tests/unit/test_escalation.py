"""The escalation ladder, climbed the way a job that keeps running out of memory climbs it."""

from __future__ import annotations

from typing import Any

from service.core.advisor import Candidate, advise
from service.core.escalation import next_rung
from service.core.spec import JobSpec
from tests.unit.shapes import LLAMA_7B, h100_node

H100 = h100_node()


def llama7b(max_attempts: int = 20, **zero: Any) -> JobSpec:
    return JobSpec(
        name="llama",
        entrypoint="train.py",
        model=LLAMA_7B,
        training={"sequence_length": 4096, "global_batch_size": 256},
        resources={"nodes": 1, "gpus_per_node": 8},
        zero=zero,
        escalation={"max_attempts": max_attempts},
    )


def climb(spec: JobSpec, failure: str, rungs: int) -> list[tuple[Candidate, str]]:
    current = advise(spec, H100).plan
    tried: list[Candidate] = []
    steps = []
    for _ in range(rungs):
        step = next_rung(spec, H100, current, failure, tried)
        if step is None:
            break
        steps.append(step)
        tried.append(current)
        current = step[0]
    return steps


def test_first_rung_after_a_gpu_oom_is_activation_checkpointing() -> None:
    spec = llama7b()
    plan = advise(spec, H100).plan
    assert not plan.activation_checkpointing

    step = next_rung(spec, H100, plan, "OOM_GPU", [])

    assert step is not None
    candidate, description = step
    assert description == "turn on activation checkpointing"
    assert candidate.activation_checkpointing and candidate.zero_stage == plan.zero_stage


def test_the_ladder_keeps_the_global_batch_and_every_rung_fits_and_saves_memory() -> None:
    spec = llama7b()
    previous = advise(spec, H100).plan
    for candidate, _ in climb(spec, "OOM_GPU", 12):
        config = candidate.ds_config
        assert config["train_batch_size"] == 256
        assert candidate.micro_batch_size * candidate.gradient_accumulation_steps * 8 == 256
        assert candidate.fits
        assert candidate.per_gpu_bytes.total < previous.per_gpu_bytes.total
        previous = candidate


def test_the_ladder_climbs_in_order_and_never_repeats() -> None:
    steps = climb(llama7b(), "OOM_GPU", 12)
    descriptions = [d for _, d in steps]

    assert descriptions[0] == "turn on activation checkpointing"
    assert "lower the reduce/all-gather buckets and the stage-3 prefetch" in descriptions
    assert "move to the next ZeRO stage" in descriptions
    assert [c.zero_stage for c, _ in steps] == sorted(c.zero_stage for c, _ in steps)
    layouts = [
        (
            c.zero_stage,
            c.offload_optimizer,
            c.offload_param,
            c.activation_checkpointing,
            c.micro_batch_size,
            c.ds_config["zero_optimization"].get("reduce_bucket_size"),
        )
        for c, _ in steps
    ]
    assert len(layouts) == len(set(layouts))


def test_lowered_buckets_reach_the_rendered_config() -> None:
    spec = llama7b(stage=2, activation_checkpointing=True)
    plan = advise(spec, H100).plan

    step = next_rung(spec, H100, plan, "OOM_GPU", [])

    assert step is not None
    candidate, description = step
    assert description.startswith("lower the reduce/all-gather buckets")
    before = plan.ds_config["zero_optimization"]["reduce_bucket_size"]
    assert candidate.ds_config["zero_optimization"]["reduce_bucket_size"] < before


def test_the_ladder_ends_at_its_top() -> None:
    spec = llama7b()
    steps = climb(spec, "OOM_GPU", 30)
    last = steps[-1][0]

    assert next_rung(spec, H100, last, "OOM_GPU", [c for c, _ in steps]) is None


def test_host_oom_unpins_buffers_then_leaves_offload() -> None:
    spec = llama7b(stage=3, offload="optimizer", activation_checkpointing=True)
    plan = advise(spec, H100).plan

    first = next_rung(spec, H100, plan, "OOM_HOST", [])
    assert first is not None and first[1] == "stop pinning the CPU offload buffers"
    assert first[0].ds_config["zero_optimization"]["offload_optimizer"]["pin_memory"] is False

    second = next_rung(spec, H100, first[0], "OOM_HOST", [plan])
    assert second is not None and second[1] == "leave CPU offload"
    assert second[0].offload_optimizer == "none"


def test_other_failures_and_disabled_escalation_have_no_next_rung() -> None:
    spec = llama7b()
    plan = advise(spec, H100).plan
    disabled = spec.model_copy(
        update={"escalation": spec.escalation.model_copy(update={"enabled": False})}
    )

    assert next_rung(spec, H100, plan, "NCCL_TIMEOUT", []) is None
    assert next_rung(disabled, H100, plan, "OOM_GPU", []) is None


def test_max_attempts_ends_the_ladder() -> None:
    spec = llama7b(max_attempts=2)
    plan = advise(spec, H100).plan
    first = next_rung(spec, H100, plan, "OOM_GPU", [])
    assert first is not None

    assert next_rung(spec, H100, first[0], "OOM_GPU", [plan]) is None


def test_a_step_that_would_not_fit_is_skipped() -> None:
    tight = H100.model_copy(update={"gpu_memory_gib": 40.0})
    spec = llama7b()
    plan = advise(spec, tight).plan

    step = next_rung(spec, tight, plan, "OOM_GPU", [])

    assert step is not None
    assert step[0].fits and step[0].per_gpu_bytes.total < plan.per_gpu_bytes.total
