"""The ds_config linter on configs teams really arrive with."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from service.core.advisor import advise
from service.core.advisor.lint import Finding, has_errors, lint_ds_config
from service.core.clusters import LOCAL_PROFILE, BackendKind, ClusterProfile
from service.core.spec import JobSpec
from tests.unit.shapes import LLAMA_7B, h100_node

H100 = h100_node(cpu_memory_gib=1024)
V100 = ClusterProfile(
    name="v100",
    kind=BackendKind.SLURM,
    accelerator="nvidia-v100-32gb",
    gpu_memory_gib=32,
    gpus_per_node=8,
    cpu_memory_gib=512,
)

BLOG_ZERO3: dict[str, Any] = {
    "train_batch_size": 256,
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 32,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
    "zero_optimization": {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "stage3_prefetch_bucket_size": 50_000_000,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
}


def llama7b_job(**zero: Any) -> JobSpec:
    return JobSpec(
        name="llama",
        entrypoint="train.py",
        model=LLAMA_7B,
        training={"sequence_length": 2048, "global_batch_size": 256},
        resources={"nodes": 1, "gpus_per_node": 8},
        zero=zero,
    )


def keys(findings: list[Finding], severity: str | None = None) -> set[str]:
    return {f.key for f in findings if severity is None or f.severity == severity}


def with_changes(**changes: Any) -> dict[str, Any]:
    config = copy.deepcopy(BLOG_ZERO3)
    for path, value in changes.items():
        target = config
        *parents, last = path.split("__")
        for parent in parents:
            target = target.setdefault(parent, {})
        if value is None:
            target.pop(last, None)
        else:
            target[last] = value
    return config


def test_a_config_the_advisor_renders_has_no_errors_or_warnings() -> None:
    spec = llama7b_job()
    plan = advise(spec, H100).plan

    findings = lint_ds_config(plan.ds_config, spec, H100)

    assert keys(findings, "error") == set() and keys(findings, "warning") == set()


def test_batch_numbers_that_disagree_are_an_error_naming_the_numbers() -> None:
    findings = lint_ds_config(with_changes(train_batch_size=128), llama7b_job(), H100)

    [batch] = [f for f in findings if f.severity == "error" and f.key == "train_batch_size"]
    assert "1 x 32 = 32" not in batch.reason  # the world size is counted
    assert "32 x 8 = 256" in batch.reason
    assert has_errors(findings)


def test_batch_numbers_no_world_size_can_satisfy_are_an_error_without_a_job() -> None:
    findings = lint_ds_config(with_changes(train_batch_size=100))

    assert "train_batch_size" in keys(findings, "error")


def test_fp16_with_a_static_loss_scale_where_bf16_exists() -> None:
    config = with_changes(bf16=None, fp16={"enabled": True, "loss_scale": 128})

    findings = lint_ds_config(config, llama7b_job(), H100)

    assert {"fp16.loss_scale", "fp16.enabled"} <= keys(findings, "warning")


def test_fp16_on_gpus_without_bf16_is_only_information() -> None:
    config = with_changes(bf16=None, fp16={"enabled": True, "loss_scale": 0})

    findings = lint_ds_config(config, None, V100)

    assert [f.severity for f in findings if f.key == "fp16.enabled"] == ["info"]


def test_zero3_where_zero2_fits_loses_throughput() -> None:
    findings = lint_ds_config(BLOG_ZERO3, llama7b_job(), H100)

    [stage] = [f for f in findings if f.key == "zero_optimization.stage"]
    assert stage.severity == "warning" and "ZeRO stage 1" in stage.fix


def test_zero3_with_checkpointing_where_zero2_with_checkpointing_fits() -> None:
    config = with_changes(activation_checkpointing={"partition_activations": False})

    findings = lint_ds_config(config, llama7b_job(), H100)

    assert "activation_checkpointing" in keys(findings, "warning")


def test_buckets_that_eat_the_headroom() -> None:
    config = with_changes(zero_optimization__stage=2, zero_optimization__reduce_bucket_size=4e9)

    findings = lint_ds_config(config, llama7b_job(), H100)

    assert "zero_optimization.reduce_bucket_size" in keys(findings, "warning")


def test_huge_stage3_prefetch_is_flagged_without_a_job() -> None:
    findings = lint_ds_config(with_changes(zero_optimization__stage3_prefetch_bucket_size=2e9))

    assert "zero_optimization.stage3_prefetch_bucket_size" in keys(findings, "warning")


def test_a_config_that_cannot_fit_is_an_error() -> None:
    config = with_changes(
        zero_optimization={"stage": 0},
        train_micro_batch_size_per_gpu=8,
        gradient_accumulation_steps=4,
    )

    findings = lint_ds_config(config, llama7b_job(), H100)

    assert "zero_optimization" in keys(findings, "error")


def test_missing_gather_on_save_under_zero3() -> None:
    config = with_changes(zero_optimization__stage3_gather_16bit_weights_on_model_save=None)

    findings = lint_ds_config(config)

    assert "zero_optimization.stage3_gather_16bit_weights_on_model_save" in keys(
        findings, "warning"
    )


def test_deprecated_removed_and_unknown_keys() -> None:
    config = with_changes(
        zero_optimization__cpu_offload=True,
        elasticity={"enabled": True},
        gradient_cliping=1.0,
        zero_optimization__reduce_bucket_sise=5e8,
    )

    findings = lint_ds_config(config)

    assert "zero_optimization.cpu_offload" in keys(findings, "warning")
    assert {"elasticity", "zero_optimization.reduce_bucket_sise"} <= keys(findings, "error")
    [typo] = [f for f in findings if f.key == "gradient_cliping"]
    assert "gradient_clipping" in typo.fix
    [zero_typo] = [f for f in findings if f.key == "zero_optimization.reduce_bucket_sise"]
    assert "reduce_bucket_size" in zero_typo.fix


def test_gradient_clipping_expected_outside_deepspeed() -> None:
    findings = lint_ds_config(with_changes(gradient_clipping=None), llama7b_job(), H100)

    [clipping] = [f for f in findings if f.key == "gradient_clipping"]
    assert clipping.severity == "warning" and "1.0" in clipping.fix


def test_max_grad_norm_in_the_optimizer_is_an_error() -> None:
    config = with_changes(optimizer={"type": "AdamW", "params": {"lr": 1e-4, "max_grad_norm": 1}})

    assert "optimizer.params.max_grad_norm" in keys(lint_ds_config(config), "error")


def test_cpu_ranks_need_torch_adam_and_offload_needs_the_force_flag_off() -> None:
    fused = with_changes(zero_optimization={"stage": 2})
    offloaded = with_changes(
        zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}},
        optimizer={"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
    )

    assert "optimizer.params.torch_adam" in keys(
        lint_ds_config(fused, None, LOCAL_PROFILE), "error"
    )
    assert "zero_force_ds_cpu_optimizer" in keys(lint_ds_config(offloaded), "error")


def test_offload_below_its_stage_has_no_effect() -> None:
    config = with_changes(zero_optimization={"stage": 2, "offload_param": {"device": "cpu"}})

    assert "zero_optimization.offload_param.device" in keys(lint_ds_config(config), "warning")


def test_hugging_face_auto_values_are_flagged() -> None:
    config = with_changes(train_micro_batch_size_per_gpu="auto")

    assert "train_micro_batch_size_per_gpu" in keys(lint_ds_config(config), "warning")


def test_offload_where_none_is_needed() -> None:
    config = with_changes(
        zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}},
        zero_force_ds_cpu_optimizer=False,
    )

    findings = lint_ds_config(config, llama7b_job(), H100)

    assert "zero_optimization.offload_optimizer" in keys(findings, "warning")


@pytest.mark.parametrize("bad", [[], "zero3.json", 3])
def test_a_config_that_is_not_an_object(bad: Any) -> None:
    findings = lint_ds_config(bad)

    assert has_errors(findings)


def test_findings_come_errors_first_with_one_sentence_reasons() -> None:
    config = with_changes(train_batch_size=100, gradient_cliping=1.0)

    findings = lint_ds_config(config)

    order = {"error": 0, "warning": 1, "info": 2}
    assert [order[f.severity] for f in findings] == sorted(order[f.severity] for f in findings)
    assert all(f.reason and f.fix and f.reason.count(". ") == 0 for f in findings)
