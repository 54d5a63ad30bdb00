"""The advisor as its users see it: plans, choice rules, batch numbers, pins and errors."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from service.core.advisor import Advice, Candidate, NoPlanFits, advise
from service.core.advisor.choice import TIE_TOLERANCE, seconds_per_sample, throughput_key
from service.core.clusters import LOCAL_PROFILE, BackendKind, ClusterProfile
from service.core.spec import JobSpec
from tests.unit.shapes import LLAMA_7B, h100_node

GIB = 1024**3

H100_NODE = h100_node(max_nodes=16)


def job(
    model: dict[str, Any] | None = None,
    *,
    nodes: int = 1,
    gpus: int = 2,
    zero: dict[str, Any] | None = None,
    **training: Any,
) -> JobSpec:
    """A job spec with the tiny example's model unless told otherwise."""
    training_spec = {"sequence_length": 32, "global_batch_size": 8, **training}
    return JobSpec(
        name="job",
        entrypoint="examples/train_tiny.py",
        model=model
        or {
            "hidden_size": 64,
            "num_layers": 2,
            "num_heads": 4,
            "vocab_size": 128,
            "tied_embeddings": False,
        },
        training=training_spec,
        resources={"nodes": nodes, "gpus_per_node": gpus},
        zero=zero or {},
    )


def llama7b(**kwargs: Any) -> JobSpec:
    kwargs.setdefault("gpus", 8)
    kwargs.setdefault("sequence_length", 4096)
    kwargs.setdefault("global_batch_size", 256)
    return job(LLAMA_7B, **kwargs)


def batch_identity_holds(candidate: Candidate, world_size: int) -> bool:
    config = candidate.ds_config
    return bool(
        config["train_batch_size"]
        == config["train_micro_batch_size_per_gpu"]
        * config["gradient_accumulation_steps"]
        * world_size
    )


def test_tiny_example_gets_a_plan_that_runs_on_the_cpu() -> None:
    advice = advise(job(), LOCAL_PROFILE)

    plan = advice.plan
    assert plan.fits
    assert plan.zero_stage == 0  # a tiny model fits without any partitioning
    assert plan.micro_batch_size == 4 and plan.gradient_accumulation_steps == 1
    assert plan.ds_config["optimizer"]["type"] == "AdamW"
    assert plan.ds_config["optimizer"]["params"]["torch_adam"] is True
    assert plan.ds_config["steps_per_print"] >= 1_000_000
    assert plan.ds_config["bf16"] == {"enabled": True}
    assert "ZeRO-0" in advice.reason


def test_every_candidate_keeps_the_batch_identity() -> None:
    advice = advise(llama7b(nodes=2), H100_NODE)

    assert advice.candidates
    assert all(batch_identity_holds(c, world_size=16) for c in advice.candidates)
    assert all(c.ds_config["train_batch_size"] == 256 for c in advice.candidates)


def test_candidate_space_covers_stages_offloads_checkpointing_and_micro_batches() -> None:
    advice = advise(job(), LOCAL_PROFILE)

    seen = {(c.zero_stage, c.offload_optimizer, c.offload_param) for c in advice.candidates}
    assert seen == {
        (0, "none", "none"),
        (1, "none", "none"),
        (1, "cpu", "none"),
        (2, "none", "none"),
        (2, "cpu", "none"),
        (3, "none", "none"),
        (3, "cpu", "none"),
        (3, "cpu", "cpu"),
    }
    assert {c.activation_checkpointing for c in advice.candidates} == {False, True}
    assert {c.micro_batch_size for c in advice.candidates} == {1, 2, 4}


def test_7b_on_eight_h100s_avoids_zero3_and_offload() -> None:
    plan = advise(llama7b(), H100_NODE).plan

    assert plan.zero_stage in (1, 2)  # ZeRO-3 is the capacity option; 7B fits without it
    assert plan.offload_optimizer == "none"
    assert plan.per_gpu_bytes.total < 72 * GIB


def test_plan_is_the_lowest_stage_then_least_offload_then_no_ckpt_then_largest_micro() -> None:
    advice = advise(llama7b(), H100_NODE)

    fitting = [c for c in advice.candidates if c.fits]
    assert advice.plan == min(fitting, key=throughput_key)
    same_layout = [c for c in fitting if throughput_key(c)[:3] == throughput_key(advice.plan)[:3]]
    assert advice.plan.micro_batch_size == max(c.micro_batch_size for c in same_layout)


def test_no_fitting_plan_is_predicted_faster_beyond_the_tie_tolerance() -> None:
    advice = advise(llama7b(), H100_NODE)

    fastest = min(seconds_per_sample(c) for c in advice.candidates if c.fits)
    assert seconds_per_sample(advice.plan) <= fastest * (1 + TIE_TOLERANCE)
    assert advice.plan.step_seconds and advice.plan.tokens_per_second
    # tokens/s is the whole job's: the global batch's tokens over one step
    tokens = 256 * 4096
    assert advice.plan.tokens_per_second == pytest.approx(tokens / advice.plan.step_seconds, 1e-3)


def test_70b_needs_zero3_and_offload_on_one_node() -> None:
    model = {
        "hidden_size": 8192,
        "num_layers": 80,
        "num_heads": 64,
        "num_kv_heads": 8,
        "vocab_size": 32000,
        "ffn_size": 28672,
        "tied_embeddings": False,
    }
    advice = advise(job(model, gpus=8, sequence_length=4096, global_batch_size=64), H100_NODE)

    assert advice.plan.zero_stage == 3
    assert advice.plan.offload_optimizer == "cpu"
    assert advice.plan.cpu_bytes_per_node > 0


def test_capacity_policy_takes_the_most_memory_saving_candidate() -> None:
    advice = advise(llama7b(), H100_NODE, policy="capacity")

    fitting = [c for c in advice.candidates if c.fits]
    assert advice.plan.per_gpu_bytes.total == min(c.per_gpu_bytes.total for c in fitting)
    assert "capacity" in advice.reason


def test_breakdown_is_the_peak_and_adds_up_to_the_total() -> None:
    for c in advise(llama7b(), H100_NODE).candidates:
        b = c.per_gpu_bytes
        parts = (
            b.params,
            b.gradients,
            b.optimizer,
            b.activations,
            b.buffers,
            b.temporaries,
            b.overhead,
        )
        assert b.total == sum(parts)
        assert min(parts) >= 0


def test_memory_savers_save_memory() -> None:
    by_label = {c.label(): c.per_gpu_bytes for c in advise(llama7b(), H100_NODE).candidates}

    assert by_label["ZeRO-3 mb=1x32"].params < by_label["ZeRO-2 mb=1x32"].params
    assert by_label["ZeRO-1 mb=1x32"].optimizer < by_label["ZeRO-0 mb=1x32"].optimizer
    assert by_label["ZeRO-3 mb=1x32"].total < by_label["ZeRO-2 mb=1x32"].total
    assert by_label["ZeRO-2 +ckpt mb=2x16"].total < by_label["ZeRO-2 mb=2x16"].total
    assert by_label["ZeRO-2 +offload(opt) mb=1x32"].optimizer == 0
    assert by_label["ZeRO-2 mb=2x16"].total > by_label["ZeRO-2 mb=1x32"].total


def test_more_gpus_shrink_zero3_state_per_gpu() -> None:
    def stage3_total(nodes: int) -> int:
        spec = llama7b(
            nodes=nodes,
            zero={"stage": 3, "offload": "none", "activation_checkpointing": True},
            micro_batch_size=1,
        )
        return advise(spec, H100_NODE).plan.per_gpu_bytes.total

    assert stage3_total(4) < stage3_total(1)


def test_offload_on_cpu_ranks_saves_nothing() -> None:
    by_label = {c.label(): c for c in advise(job(), LOCAL_PROFILE).candidates}

    plain, offloaded = by_label["ZeRO-2 mb=4x1"], by_label["ZeRO-2 +offload(opt) mb=4x1"]
    assert offloaded.per_gpu_bytes.total >= plain.per_gpu_bytes.total


def test_relative_cost_orders_the_memory_savers() -> None:
    by_label = {c.label(): c.relative_cost for c in advise(llama7b(nodes=2), H100_NODE).candidates}

    assert by_label["ZeRO-1 mb=1x16"] <= by_label["ZeRO-2 mb=1x16"] < by_label["ZeRO-3 mb=1x16"]
    assert by_label["ZeRO-2 mb=1x16"] < by_label["ZeRO-2 +ckpt mb=1x16"]
    assert by_label["ZeRO-2 mb=1x16"] < by_label["ZeRO-2 +offload(opt) mb=1x16"]
    assert by_label["ZeRO-2 mb=2x8"] < by_label["ZeRO-2 mb=1x16"]


def test_pinned_fields_are_honoured() -> None:
    spec = llama7b(
        zero={"stage": 3, "offload": "optimizer", "activation_checkpointing": True},
        micro_batch_size=2,
    )
    advice = advise(spec, H100_NODE)

    assert {
        (
            c.zero_stage,
            c.offload_optimizer,
            c.offload_param,
            c.activation_checkpointing,
            c.micro_batch_size,
        )
        for c in advice.candidates
    } == {(3, "cpu", "none", True, 2)}
    assert advice.plan.ds_config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "activation_checkpointing" in advice.plan.ds_config
    assert advice.plan.gradient_accumulation_steps == 16


def test_pinned_accumulation_fixes_the_micro_batch() -> None:
    advice = advise(job(gradient_accumulation_steps=2), LOCAL_PROFILE)

    assert {c.micro_batch_size for c in advice.candidates} == {2}


def test_a_pinned_choice_that_does_not_fit_is_kept_with_a_warning() -> None:
    spec = llama7b(zero={"stage": 0, "activation_checkpointing": False})
    advice = advise(spec, H100_NODE)

    assert advice.plan.zero_stage == 0 and not advice.plan.fits
    assert any("do not fit" in w and "zero.stage=0" in w for w in advice.warnings)
    assert "pinned" in advice.reason


def test_nothing_fits_names_the_closest_candidate_and_the_overshoot() -> None:
    small = ClusterProfile(
        name="small",
        kind=BackendKind.LOCAL,
        accelerator="nvidia-t4",
        gpu_memory_gib=16,
        gpus_per_node=1,
        cpu_memory_gib=64,
    )
    with pytest.raises(NoPlanFits) as raised:
        advise(llama7b(gpus=1, global_batch_size=8), small)

    error = raised.value
    assert error.over_by_bytes > 0
    assert isinstance(error.closest, Candidate)
    assert "over by" in str(error) and error.closest.label() in str(error)


def test_user_overrides_are_merged_and_change_the_prediction() -> None:
    # on CPU ranks the buckets are alive at the peak (on a GPU, forward peaks come before them)
    default = advise(job(zero={"stage": 2}), LOCAL_PROFILE).plan
    spec = job(
        zero={
            "stage": 2,
            "overrides": {
                "zero_optimization": {"reduce_bucket_size": 200_000},
                "wall_clock_breakdown": True,
            },
        }
    )
    tuned = advise(spec, LOCAL_PROFILE).plan

    assert tuned.ds_config["zero_optimization"]["reduce_bucket_size"] == 200_000
    assert tuned.ds_config["wall_clock_breakdown"] is True
    assert tuned.per_gpu_bytes.buffers < default.per_gpu_bytes.buffers


def test_an_override_that_breaks_the_batch_identity_is_refused() -> None:
    spec = job(zero={"overrides": {"train_batch_size": 12}})
    with pytest.raises(ValueError, match=r"train_batch_size \(12\) must equal"):
        advise(spec, LOCAL_PROFILE)


def test_an_override_that_changes_the_stage_is_refused() -> None:
    spec = job(zero={"stage": 1, "overrides": {"zero_optimization": {"stage": 3}}})
    with pytest.raises(ValueError, match=r"pin the stage with zero\.stage"):
        advise(spec, LOCAL_PROFILE)


def test_parameter_count_alone_gives_a_plan_and_says_the_shape_was_inferred() -> None:
    advice = advise(
        job({"parameters": 1_300_000_000}, gpus=8, sequence_length=2048, global_batch_size=64),
        H100_NODE,
    )

    assert any("inferred" in w for w in advice.warnings)
    assert isinstance(advice, Advice) and advice.plan.fits


def test_fp16_renders_dynamic_loss_scaling_and_fp32_neither_block() -> None:
    fp16 = advise(job(precision="fp16"), LOCAL_PROFILE).plan.ds_config
    fp32 = advise(job(precision="fp32"), LOCAL_PROFILE).plan.ds_config

    assert fp16["fp16"]["enabled"] is True and fp16["fp16"]["loss_scale"] == 0
    assert "fp16" not in fp32 and "bf16" not in fp32


def test_gpu_clusters_use_deepspeeds_fused_adam_and_cpu_offload_keeps_torch_adam() -> None:
    gpu = advise(llama7b(), H100_NODE).plan.ds_config
    cpu_offload = advise(
        job(zero={"stage": 2, "offload": "optimizer"}), LOCAL_PROFILE
    ).plan.ds_config

    assert "torch_adam" not in gpu["optimizer"]["params"]
    assert cpu_offload["optimizer"]["params"]["torch_adam"] is True
    assert cpu_offload["zero_force_ds_cpu_optimizer"] is False


def test_model_sized_buckets_for_small_models() -> None:
    zero = advise(job(zero={"stage": 2}), LOCAL_PROFILE).plan.ds_config["zero_optimization"]

    assert zero["reduce_bucket_size"] == 1_000_000  # not DeepSpeed's 5e8 for a 100k model


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"hidden_size": 65, "num_layers": 2, "num_heads": 4, "vocab_size": 128}, "must divide"),
        ({"hidden_size": 0, "num_layers": 2, "num_heads": 4, "vocab_size": 128}, "greater than 0"),
        (
            {"hidden_size": 64, "num_layers": -1, "num_heads": 4, "vocab_size": 128},
            "greater than 0",
        ),
        ({"num_layers": 2}, "give either model.parameters"),
    ],
)
def test_bad_model_shapes_are_named(model: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        job(model)


def test_inconsistent_batch_numbers_are_named() -> None:
    with pytest.raises(ValidationError, match="micro_batch_size"):
        job(micro_batch_size=3)


def test_more_gpus_than_the_cluster_has_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"gpus_per_node \(4\) exceeds"):
        advise(job(gpus=4), LOCAL_PROFILE)


def test_unknown_policy_is_an_error() -> None:
    with pytest.raises(ValueError, match="policy"):
        advise(job(), LOCAL_PROFILE, policy="fastest")  # type: ignore[arg-type]


def test_candidate_json_matches_the_interface() -> None:
    data = advise(job(), LOCAL_PROFILE).plan.model_dump(mode="json")

    assert set(data) == {
        "zero_stage",
        "offload_optimizer",
        "offload_param",
        "activation_checkpointing",
        "micro_batch_size",
        "gradient_accumulation_steps",
        "per_gpu_bytes",
        "cpu_bytes_per_node",
        "fits",
        "relative_cost",
        "ds_config",
        "peak_phase",
        "step_seconds",
        "tokens_per_second",
        "initialize_bytes",
    }
    assert data["peak_phase"] in ("forward", "backward", "step")
    assert set(data["per_gpu_bytes"]) == {
        "params",
        "gradients",
        "optimizer",
        "activations",
        "buffers",
        "temporaries",
        "overhead",
        "total",
    }


def test_a_huge_global_batch_is_planned_without_walking_every_number() -> None:
    advice = advise(job(gpus=1, global_batch_size=3 * 2**22), LOCAL_PROFILE)  # near the limit

    micros = {c.micro_batch_size for c in advice.candidates}
    assert micros == {*(2**i for i in range(11)), 3 * 2**22}  # small powers of two, the whole
    assert advice.plan.fits
