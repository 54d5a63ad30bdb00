"""Static lint rules: what a ds_config gets wrong on its own, whatever the model and hardware.

Each rule returns findings; the numbers in the reasons are the config's own. Pitfall numbers refer
to the ZeRO article's list of ten (see docs/advisor.md).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from service.core.advisor import ds_keys
from service.core.advisor.findings import Finding, error, info, warning
from service.core.clusters import ClusterProfile
from service.core.spec import JobSpec

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
NO_BF16 = ("v100", "t4", "p100", "p40", "k80", "m60", "rtx-20", "quadro")
SMALL_BUCKET = 10_000_000  # below this, communication turns into many small messages (pitfall 2)
LARGE_PREFETCH = 500_000_000

Rule = Callable[[dict[str, Any], JobSpec | None, ClusterProfile | None], list[Finding]]


def zero_block(config: dict[str, Any]) -> dict[str, Any]:
    zero = config.get("zero_optimization")
    return zero if isinstance(zero, dict) else {}


def stage_of(config: dict[str, Any]) -> int:
    stage = zero_block(config).get("stage", 0)
    return stage if isinstance(stage, int) else 0


def enabled(config: dict[str, Any], block: str) -> bool:
    value = config.get(block)
    return isinstance(value, dict) and value.get("enabled") is True


def offload_device(config: dict[str, Any], key: str) -> str:
    block = zero_block(config).get(key)
    return str(block.get("device", "none")) if isinstance(block, dict) else "none"


def batch_rules(
    config: dict[str, Any], spec: JobSpec | None, _: ClusterProfile | None
) -> list[Finding]:
    findings, numbers = [], {}
    for key in BATCH_KEYS:
        value = config.get(key)
        if value is None or value == "auto":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            findings.append(
                error(
                    key,
                    f"{key} must be a positive integer, not {value!r}",
                    f"set {key} to a positive integer",
                )
            )
        else:
            numbers[key] = value
    if "train_batch_size" not in config and "train_micro_batch_size_per_gpu" not in config:
        findings.append(
            error(
                "train_batch_size",
                "DeepSpeed needs train_batch_size or train_micro_batch_size_per_gpu",
                "set all three batch numbers",
            )
        )
    if len(numbers) == 3:
        findings.extend(_batch_identity(numbers, spec))
    return findings


def _batch_identity(numbers: dict[str, int], spec: JobSpec | None) -> list[Finding]:
    total = numbers["train_batch_size"]
    per_world = numbers["train_micro_batch_size_per_gpu"] * numbers["gradient_accumulation_steps"]
    if spec is None:
        if total % per_world:
            return [
                error(
                    "train_batch_size",
                    f"train_batch_size ({total}) is not a multiple of "
                    f"micro x accumulation ({per_world}), so no world size makes them agree",
                    "set train_batch_size = micro x accumulation x world size",
                )
            ]
        return []
    world = spec.resources.world_size
    findings = []
    if total != per_world * world:
        findings.append(
            error(
                "train_batch_size",
                f"train_batch_size ({total}) != micro x accumulation x world size "
                f"({per_world} x {world} = {per_world * world})",
                f"set train_batch_size to {per_world * world} or change micro/accumulation",
            )
        )
    if total != spec.training.global_batch_size:
        findings.append(
            warning(
                "train_batch_size",
                f"train_batch_size ({total}) differs from the job's global_batch_size "
                f"({spec.training.global_batch_size}), so the learning-rate schedule sees "
                "another batch",
                "make the config and the job agree on the global batch",
            )
        )
    return findings


def precision_rules(
    config: dict[str, Any], _: JobSpec | None, profile: ClusterProfile | None
) -> list[Finding]:
    fp16, bf16 = enabled(config, "fp16"), enabled(config, "bf16")
    if fp16 and bf16:
        return [
            error(
                "fp16.enabled",
                "fp16 and bf16 are both enabled",
                "enable only one of them, bf16 where the hardware supports it",
            )
        ]
    if not fp16:
        return []
    findings = []
    loss_scale = config["fp16"].get("loss_scale", 0)
    if loss_scale != 0:
        findings.append(
            warning(
                "fp16.loss_scale",
                f"a static loss scale ({loss_scale}) overflows "
                "into NaN losses when gradients grow (pitfall 6)",
                "set fp16.loss_scale to 0 for dynamic loss scaling",
            )
        )
    findings.append(_prefer_bf16(profile))
    return findings


def _prefer_bf16(profile: ClusterProfile | None) -> Finding:
    reason = "bf16 keeps fp32's range, so it needs no loss scaling and overflows far less"
    fix = 'use "bf16": {"enabled": true} instead of fp16'
    if profile is None:
        return info("fp16.enabled", reason + ", on Ampere or newer GPUs", fix)
    accelerator = profile.accelerator.lower()
    if any(old in accelerator for old in NO_BF16):
        return info(
            "fp16.enabled",
            f"fp16 is right on {profile.accelerator}, which lacks bf16; keep dynamic loss scaling",
            "keep fp16.loss_scale at 0",
        )
    return warning("fp16.enabled", f"{reason}, and {profile.accelerator} supports it", fix)


def key_rules(
    config: dict[str, Any], _: JobSpec | None, __: ClusterProfile | None
) -> list[Finding]:
    findings = []
    for key in config:
        if key in ds_keys.REMOVED_TOP_LEVEL:
            findings.append(
                error(
                    key,
                    f"DeepSpeed 0.19 rejects '{key}': {ds_keys.REMOVED_TOP_LEVEL[key]}",
                    f"remove '{key}'",
                )
            )
        elif key not in ds_keys.TOP_LEVEL:
            findings.append(
                warning(
                    key,
                    f"DeepSpeed silently ignores the unknown key '{key}'",
                    _did_you_mean(key, ds_keys.TOP_LEVEL),
                )
            )
    findings.extend(_zero_key_findings(zero_block(config)))
    return findings


def _zero_key_findings(zero: dict[str, Any]) -> list[Finding]:
    findings = []
    for key in zero:
        path = f"zero_optimization.{key}"
        if key in ds_keys.REMOVED_ZERO:
            findings.append(
                error(
                    path,
                    f"DeepSpeed 0.19 rejects it: {ds_keys.REMOVED_ZERO[key]}",
                    f"remove '{key}'",
                )
            )
        elif key in ds_keys.DEPRECATED_ZERO:
            findings.append(
                warning(path, f"'{key}' is deprecated", f"use {ds_keys.DEPRECATED_ZERO[key]}")
            )
        elif key not in ds_keys.ZERO:
            findings.append(
                error(
                    path,
                    f"DeepSpeed rejects the unknown zero_optimization key '{key}'",
                    _did_you_mean(key, ds_keys.ZERO),
                )
            )
    for block, known in (
        ("offload_optimizer", ds_keys.OFFLOAD_OPTIMIZER),
        ("offload_param", ds_keys.OFFLOAD_PARAM),
    ):
        settings = zero.get(block)
        for key in settings if isinstance(settings, dict) else {}:
            if key not in known:
                findings.append(
                    error(
                        f"zero_optimization.{block}.{key}",
                        f"DeepSpeed rejects the unknown {block} key '{key}'",
                        _did_you_mean(key, known),
                    )
                )
    return findings


def _did_you_mean(key: str, known: frozenset[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1)
    return f"did you mean '{close[0]}'?" if close else f"remove '{key}'"


def offload_rules(
    config: dict[str, Any], _: JobSpec | None, __: ClusterProfile | None
) -> list[Finding]:
    findings, stage, zero = [], stage_of(config), zero_block(config)
    for key, needs in (("offload_optimizer", 1), ("offload_param", 3)):
        device = offload_device(config, key)
        path = f"zero_optimization.{key}.device"
        if device not in ("none", "cpu", "nvme"):
            findings.append(
                error(
                    path, f"offload device must be none, cpu or nvme, not {device!r}", 'use "cpu"'
                )
            )
        elif device != "none" and (stage < needs or (needs == 3 and stage != 3)):
            findings.append(
                warning(
                    path,
                    f"{key} has no effect at ZeRO stage {stage}",
                    f"use ZeRO stage {needs}{'' if needs == 3 else ' or higher'} "
                    "or remove the block",
                )
            )
        elif device == "nvme" and not zero.get(key, {}).get("nvme_path"):
            findings.append(
                error(
                    f"zero_optimization.{key}.nvme_path",
                    "NVMe offload needs nvme_path",
                    "set nvme_path to a local NVMe mount",
                )
            )
    return findings


def optimizer_rules(
    config: dict[str, Any], _: JobSpec | None, profile: ClusterProfile | None
) -> list[Finding]:
    optimizer = config.get("optimizer")
    if not isinstance(optimizer, dict):
        return [
            info(
                "optimizer",
                "no optimizer block: the script must hand its own optimizer to "
                "deepspeed.initialize",
                "add an optimizer block so ZeRO can partition it",
            )
        ]
    params = optimizer.get("params") if isinstance(optimizer.get("params"), dict) else {}
    assert isinstance(params, dict)
    findings = []
    if "max_grad_norm" in params:
        findings.append(
            error(
                "optimizer.params.max_grad_norm",
                "DeepSpeed refuses max_grad_norm as an optimizer parameter",
                "use the top-level gradient_clipping",
            )
        )
    adam = str(optimizer.get("type", "")).lower() in ("adam", "adamw")
    torch_adam = params.get("torch_adam") is True
    if adam and not torch_adam and profile is not None and profile.accelerator.lower() == "cpu":
        findings.append(
            error(
                "optimizer.params.torch_adam",
                "without torch_adam DeepSpeed builds "
                "its fused CUDA Adam, which CPU ranks cannot build or run",
                "set optimizer.params.torch_adam to true",
            )
        )
    offloaded = offload_device(config, "offload_optimizer") != "none" and stage_of(config) > 0
    if offloaded and torch_adam and config.get("zero_force_ds_cpu_optimizer", True):
        findings.append(
            error(
                "zero_force_ds_cpu_optimizer",
                "DeepSpeed refuses torch's Adam under optimizer offload unless this is false",
                "set zero_force_ds_cpu_optimizer to false, or drop torch_adam",
            )
        )
    return findings


def communication_rules(
    config: dict[str, Any], _: JobSpec | None, __: ClusterProfile | None
) -> list[Finding]:
    stage, zero, findings = stage_of(config), zero_block(config), []
    if stage == 0:
        return []
    if zero.get("overlap_comm") is False:
        findings.append(
            info(
                "zero_optimization.overlap_comm",
                "communication does not overlap the backward pass",
                "set overlap_comm to true",
            )
        )
    if stage >= 2 and zero.get("contiguous_gradients") is False:
        findings.append(
            info(
                "zero_optimization.contiguous_gradients",
                "scattered gradient copies fragment memory (pitfall 7)",
                "set contiguous_gradients to true",
            )
        )
    if stage == 2 and zero.get("reduce_scatter") is False:
        findings.append(
            info(
                "zero_optimization.reduce_scatter",
                "ZeRO-2 then all-reduces gradients instead of reduce-scattering them",
                "set reduce_scatter to true",
            )
        )
    findings.extend(_bucket_size_findings(zero, stage))
    return findings


def _bucket_size_findings(zero: dict[str, Any], stage: int) -> list[Finding]:
    findings = []
    for key in ("reduce_bucket_size", "allgather_bucket_size"):
        value = zero.get(key)
        if isinstance(value, int | float) and 0 < value < SMALL_BUCKET:
            findings.append(
                info(
                    f"zero_optimization.{key}",
                    f"a {value:.0e}-element bucket "
                    "sends many small messages and lowers throughput (pitfall 2)",
                    "raise it step by step (1e8, 2e8, 5e8) watching memory",
                )
            )
    prefetch = zero.get("stage3_prefetch_bucket_size", zero.get("prefetch_bucket_size"))
    if stage == 3 and isinstance(prefetch, int | float) and prefetch > LARGE_PREFETCH:
        findings.append(
            warning(
                "zero_optimization.stage3_prefetch_bucket_size",
                f"a {prefetch:.0e}-element prefetch raises the ZeRO-3 peak (pitfall 1)",
                "lower it first when ZeRO-3 runs out of memory",
            )
        )
    return findings


def saving_rules(
    config: dict[str, Any], _: JobSpec | None, __: ClusterProfile | None
) -> list[Finding]:
    zero = zero_block(config)
    gather = zero.get(
        "stage3_gather_16bit_weights_on_model_save",
        zero.get("gather_16bit_weights_on_model_save", False),
    )
    if stage_of(config) == 3 and not gather:
        return [
            warning(
                "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                "under ZeRO-3 a saved model is only shards unless the 16-bit weights "
                "are gathered on save (pitfall 3)",
                "set it to true if the job exports a model",
            )
        ]
    return []


def clipping_rules(
    config: dict[str, Any], spec: JobSpec | None, __: ClusterProfile | None
) -> list[Finding]:
    if config.get("gradient_clipping"):
        return []
    if spec is not None and spec.training.gradient_clipping:
        return [
            warning(
                "gradient_clipping",
                f"the job clips at "
                f"{spec.training.gradient_clipping} but the config does not, and clipping "
                "outside DeepSpeed sees only this rank's gradient shard (pitfall 5)",
                f"set gradient_clipping to {spec.training.gradient_clipping}",
            )
        ]
    if stage_of(config) >= 2:
        return [
            info(
                "gradient_clipping",
                "gradients are sharded under ZeRO-2/3, so a script "
                "clipping model.parameters() itself computes the wrong norm (pitfall 5)",
                "clip with gradient_clipping in the config, not in the script",
            )
        ]
    return []


def auto_value_rules(
    config: dict[str, Any], _: JobSpec | None, __: ClusterProfile | None
) -> list[Finding]:
    return [
        warning(
            path,
            '"auto" is resolved only by the Hugging Face Trainer; the deepspeed '
            "launcher drops or rejects it",
            "replace it with a number",
        )
        for path in _auto_paths(config, "")
    ]


def _auto_paths(value: Any, path: str) -> list[str]:
    if isinstance(value, dict):
        return [
            p
            for key, item in value.items()
            for p in _auto_paths(item, f"{path}.{key}" if path else str(key))
        ]
    return [path] if value == "auto" else []


STATIC_RULES: tuple[Rule, ...] = (
    batch_rules,
    precision_rules,
    key_rules,
    offload_rules,
    optimizer_rules,
    communication_rules,
    saving_rules,
    clipping_rules,
    auto_value_rules,
)


def static_findings(
    config: dict[str, Any], spec: JobSpec | None, profile: ClusterProfile | None
) -> list[Finding]:
    return [finding for rule in STATIC_RULES for finding in rule(config, spec, profile)]
