"""Static lint rules about ZeRO itself: offload, optimizer, communication, saving, clipping.

Split from ``lint_rules`` (batch numbers, precision, keys) only to keep modules small; both
feed ``static_findings``. Pitfall numbers refer to the ZeRO article's list of ten.
"""

from __future__ import annotations

from typing import Any

from service.core.advisor.findings import Finding, error, info, warning
from service.core.advisor.lint_config import offload_device, stage_of, zero_block
from service.core.clusters import ClusterProfile
from service.core.spec import JobSpec

SMALL_BUCKET = 10_000_000  # below this, communication turns into many small messages (pitfall 2)
LARGE_PREFETCH = 500_000_000


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
