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
from service.core.advisor.lint_config import enabled, zero_block
from service.core.advisor.lint_zero_rules import (
    auto_value_rules,
    clipping_rules,
    communication_rules,
    offload_rules,
    optimizer_rules,
    saving_rules,
)
from service.core.clusters import ClusterProfile
from service.core.spec import JobSpec

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
NO_BF16 = ("v100", "t4", "p100", "p40", "k80", "m60", "rtx-20", "quadro")

Rule = Callable[[dict[str, Any], JobSpec | None, ClusterProfile | None], list[Finding]]


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
