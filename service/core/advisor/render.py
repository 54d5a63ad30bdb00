"""Render a layout into a complete ds_config through ``ds_templates``, then apply overrides.

The batch identity ``train_batch_size = micro x accumulation x world size`` is written here and
checked again after the user's raw overrides are merged, so no config leaves the advisor with
numbers DeepSpeed would reject or, worse, accept with a learning-rate schedule for another batch.
"""

from __future__ import annotations

from typing import Any

import ds_templates
from service.core.advisor.layout import Knobs, Layout, Workload
from service.core.advisor.models import BadOverrides
from service.core.spec import TrainingSpec

QUIET_STEPS = 1_000_000_000  # DeepSpeed prints every `steps_per_print` steps; keep logs quiet
OPTIMIZER_TYPES = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}


def render_ds_config(
    work: Workload, layout: Layout, training: TrainingSpec, overrides: dict[str, Any]
) -> dict[str, Any]:
    """The ds_config for one layout, with the user's overrides merged and re-validated."""
    config = ds_templates.compose(
        layout.stage,
        layout.offload_optimizer,
        layout.offload_param,
        work.precision,  # type: ignore[arg-type]
    )
    config["train_batch_size"] = work.global_batch
    config["train_micro_batch_size_per_gpu"] = layout.micro_batch
    config["gradient_accumulation_steps"] = layout.accumulation
    config["steps_per_print"] = QUIET_STEPS
    if training.gradient_clipping:
        config["gradient_clipping"] = training.gradient_clipping
    config.update(optimizer_settings(work, layout, training))
    _fill_zero_knobs(config["zero_optimization"], layout)
    if layout.checkpointing:
        config["activation_checkpointing"] = checkpointing_block(work.shape.layers)
    merged = ds_templates.deep_merge(config, overrides) if overrides else config
    check_rendered(merged, layout, work.world_size)
    return merged


def optimizer_settings(work: Workload, layout: Layout, training: TrainingSpec) -> dict[str, Any]:
    """The optimizer block; torch's AdamW where no fused CUDA kernel can or should be built."""
    params: dict[str, Any] = {"lr": training.learning_rate}
    settings: dict[str, Any] = {}
    if work.optimizer == "sgd":
        params["momentum"] = 0.9
        settings["zero_allow_untested_optimizer"] = True
    else:
        params["adam_w_mode"] = work.optimizer == "adamw"
        if work.optimizer_impl == "torch":
            params["torch_adam"] = True
    if work.optimizer_impl == "torch" and layout.offload_optimizer:
        settings["zero_force_ds_cpu_optimizer"] = False  # keep torch's AdamW under offload
    settings["optimizer"] = {"type": OPTIMIZER_TYPES[work.optimizer], "params": params}
    return settings


def checkpointing_block(layers: int) -> dict[str, Any]:
    """DeepSpeed's activation-checkpointing settings: one checkpoint per transformer block."""
    return {
        "partition_activations": False,
        "contiguous_memory_optimization": False,
        "cpu_checkpointing": False,
        "number_checkpoints": layers,
        "synchronize_checkpoint_boundary": False,
        "profile": False,
    }


def _fill_zero_knobs(zero: dict[str, Any], layout: Layout) -> None:
    knobs = layout.knobs
    if layout.stage == 0:
        return
    zero["overlap_comm"] = knobs.overlap_comm
    zero["reduce_bucket_size"] = knobs.reduce_bucket_size
    if layout.stage < 3:
        zero["allgather_bucket_size"] = knobs.allgather_bucket_size
    else:
        zero["stage3_prefetch_bucket_size"] = knobs.prefetch_bucket_size
        zero["stage3_param_persistence_threshold"] = knobs.param_persistence_threshold
        zero["stage3_max_live_parameters"] = knobs.max_live_parameters
    for key in ("offload_optimizer", "offload_param"):
        if key in zero:
            zero[key]["pin_memory"] = knobs.pin_memory


def check_rendered(config: dict[str, Any], layout: Layout, world_size: int) -> None:
    """Raise BadOverrides when merged overrides contradict the plan or the batch identity."""
    check_batch_identity(config, world_size)
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise BadOverrides("zero.overrides: 'zero_optimization' must be an object")
    if zero.get("stage", 0) != layout.stage:
        raise BadOverrides(
            f"zero.overrides sets zero_optimization.stage={zero.get('stage')!r} but the plan is "
            f"stage {layout.stage}; pin the stage with zero.stage instead"
        )
    for key, offloaded in (
        ("offload_optimizer", layout.offload_optimizer),
        ("offload_param", layout.offload_param),
    ):
        device = _offload_device(zero.get(key))
        if (device == "cpu") != offloaded or device not in ("none", "cpu"):
            raise BadOverrides(
                f"zero.overrides sets zero_optimization.{key}.device={device!r}, which the plan "
                "does not use; choose offload with zero.offload instead"
            )


def _offload_device(block: Any) -> str:
    if block is None:
        return "none"
    if not isinstance(block, dict):
        return repr(block)
    return str(block.get("device", "none"))


def check_batch_identity(config: dict[str, Any], world_size: int) -> None:
    """Raise BadOverrides unless train_batch_size = micro x accumulation x world size."""
    numbers = {}
    for key in (
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
    ):
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise BadOverrides(f"{key} must be a positive integer, not {value!r}")
        numbers[key] = value
    total = numbers["train_batch_size"]
    micro, accumulation = (
        numbers["train_micro_batch_size_per_gpu"],
        numbers["gradient_accumulation_steps"],
    )
    if total != micro * accumulation * world_size:
        raise BadOverrides(
            f"train_batch_size ({total}) must equal train_micro_batch_size_per_gpu ({micro}) x "
            f"gradient_accumulation_steps ({accumulation}) x world size ({world_size}) = "
            f"{micro * accumulation * world_size}"
        )


def knobs_from_overrides(base: Knobs, overrides: dict[str, Any]) -> Knobs:
    """The memory-relevant knobs after the user's overrides, so predictions match the config."""
    zero = overrides.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise BadOverrides("zero.overrides: 'zero_optimization' must be an object")
    pin = _override_pin(zero, base.pin_memory)
    return Knobs(
        reduce_bucket_size=_int_knob(zero, ("reduce_bucket_size",), base.reduce_bucket_size),
        allgather_bucket_size=_int_knob(
            zero, ("allgather_bucket_size",), base.allgather_bucket_size
        ),
        prefetch_bucket_size=_int_knob(
            zero, ("stage3_prefetch_bucket_size", "prefetch_bucket_size"), base.prefetch_bucket_size
        ),
        param_persistence_threshold=_int_knob(
            zero,
            ("stage3_param_persistence_threshold", "param_persistence_threshold"),
            base.param_persistence_threshold,
        ),
        max_live_parameters=_int_knob(
            zero, ("stage3_max_live_parameters", "max_live_parameters"), base.max_live_parameters
        ),
        overlap_comm=bool(zero.get("overlap_comm", base.overlap_comm)),
        pin_memory=pin,
    )


def _int_knob(zero: dict[str, Any], names: tuple[str, ...], default: int) -> int:
    for name in names:
        if name in zero:
            value = zero[name]
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise BadOverrides(
                    f"zero_optimization.{name} must be a non-negative number, not {value!r}"
                )
            return int(value)
    return default


def _override_pin(zero: dict[str, Any], default: bool) -> bool:
    for key in ("offload_optimizer", "offload_param"):
        block = zero.get(key)
        if isinstance(block, dict) and "pin_memory" in block:
            return bool(block["pin_memory"])
    return default
