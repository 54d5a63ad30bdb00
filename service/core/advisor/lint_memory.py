"""Memory-aware lint rules: the user's config priced by the advisor's memory model.

With a job spec and a cluster profile the linter knows the model and the GPUs, so it can say
whether the config fits, whether its buckets eat the headroom, and whether a lower ZeRO stage
(or ZeRO-2 with checkpointing instead of ZeRO-3) would fit and run faster.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from service.core.advisor.constants import DEFAULT_HEADROOM
from service.core.advisor.findings import Finding, error, info, warning
from service.core.advisor.layout import (
    ARTICLE_BUCKET,
    DEFAULT_MAX_LIVE,
    DEFAULT_PERSISTENCE,
    DEFAULT_PREFETCH,
    Knobs,
    Layout,
    Workload,
)
from service.core.advisor.lint_config import offload_device, stage_of
from service.core.advisor.memory import predict_memory
from service.core.advisor.models import GIB
from service.core.advisor.render import knobs_from_overrides
from service.core.advisor.workload import budget_bytes, build_workload
from service.core.clusters import ClusterProfile
from service.core.spec import JobSpec

BUFFER_SHARE = 0.10  # buckets above this share of the budget crowd out activations (pitfall 1)


def deepspeed_default_knobs(stage: int) -> Knobs:
    """What DeepSpeed uses for keys a config leaves out."""
    return Knobs(
        ARTICLE_BUCKET,
        ARTICLE_BUCKET,
        DEFAULT_PREFETCH,
        DEFAULT_PERSISTENCE,
        DEFAULT_MAX_LIVE,
        overlap_comm=stage == 3,
        pin_memory=False,
    )


def layout_from_config(config: dict[str, Any], spec: JobSpec, work: Workload) -> Layout | None:
    """The layout a user's config describes, or None when its batch numbers are unusable."""
    stage = stage_of(config)
    micro = config.get("train_micro_batch_size_per_gpu")
    if not isinstance(micro, int) or micro <= 0 or work.per_rank_batch % micro:
        return None
    checkpointing = (
        "activation_checkpointing" in config or spec.zero.activation_checkpointing is True
    )
    try:
        knobs = knobs_from_overrides(deepspeed_default_knobs(stage), config)
    except ValueError:
        return None
    offload_optimizer = stage > 0 and offload_device(config, "offload_optimizer") != "none"
    offload_param = stage == 3 and offload_device(config, "offload_param") != "none"
    return Layout(
        stage,
        offload_optimizer,
        offload_param,
        checkpointing,
        micro,
        work.per_rank_batch // micro,
        knobs,
    )


def memory_findings(
    config: dict[str, Any], spec: JobSpec, profile: ClusterProfile
) -> list[Finding]:
    try:
        work = build_workload(spec, profile)
    except ValueError as problem:
        return [error("", str(problem), "match the job's resources to the cluster")]
    layout = layout_from_config(config, spec, work)
    if layout is None:
        return []
    budget = budget_bytes(profile, DEFAULT_HEADROOM)
    findings = fit_findings(work, layout, budget) + bucket_findings(work, layout, budget)
    return findings + stage_findings(work, layout, budget)


def fit_findings(work: Workload, layout: Layout, budget: int) -> list[Finding]:
    total = predict_memory(work, layout).per_gpu.total
    if total <= budget:
        return []
    return [
        error(
            "zero_optimization",
            f"predicted {total / GIB:.2f} GiB per GPU exceeds the {budget / GIB:.2f} GiB usable",
            "run `zeropilot advise` on the job for a plan that fits",
        )
    ]


def bucket_findings(work: Workload, layout: Layout, budget: int) -> list[Finding]:
    findings = []
    buffers = predict_memory(work, layout).per_gpu.buffers
    if buffers > BUFFER_SHARE * budget:
        findings.append(
            warning(
                "zero_optimization.reduce_bucket_size",
                f"communication buckets and prefetch hold {buffers / GIB:.2f} GiB, "
                f"{buffers / budget:.0%} of the usable memory (pitfall 1)",
                "lower reduce_bucket_size, allgather_bucket_size and stage3_prefetch_bucket_size",
            )
        )
    if layout.stage > 0 and layout.knobs.reduce_bucket_size > work.shape.parameters:
        findings.append(
            info(
                "zero_optimization.reduce_bucket_size",
                f"the bucket ({layout.knobs.reduce_bucket_size:.0e} elements) is larger "
                f"than the model ({work.shape.parameters:.1e} parameters), and "
                "DeepSpeed allocates it whole",
                f"set it to about {work.shape.parameters:.0e}",
            )
        )
    return findings


def stage_findings(work: Workload, layout: Layout, budget: int) -> list[Finding]:
    """ZeRO-3 (or offload) where something cheaper fits: throughput given away."""
    if layout.stage == 3:
        return _zero3_findings(work, layout, budget)
    plain = replace(layout, offload_optimizer=False, offload_param=False)
    if layout.offload_optimizer and _fits(work, plain, budget):
        return [
            warning(
                "zero_optimization.offload_optimizer",
                f"ZeRO-{layout.stage} fits "
                "without offload, which moves every step's update through PCIe and the CPU",
                "remove offload_optimizer",
            )
        ]
    return []


def _zero3_findings(work: Workload, layout: Layout, budget: int) -> list[Finding]:
    for stage in (1, 2):
        lower = replace(
            layout,
            stage=stage,
            offload_optimizer=False,
            offload_param=False,
            knobs=replace(layout.knobs, overlap_comm=True),
        )
        if not _fits(work, lower, budget):
            continue
        if layout.checkpointing:
            return [
                warning(
                    "activation_checkpointing",
                    f"ZeRO-{stage} with checkpointing fits; "
                    "ZeRO-3 plus checkpointing pays both recompute and per-layer gathers "
                    "(pitfall 8)",
                    f"use ZeRO-{stage} with activation checkpointing",
                )
            ]
        return [
            warning(
                "zero_optimization.stage",
                f"ZeRO-{stage} fits, and ZeRO-3 gathers every "
                "layer's parameters forward and backward, costing throughput",
                f"use ZeRO stage {stage}",
            )
        ]
    return []


def _fits(work: Workload, layout: Layout, budget: int) -> bool:
    return predict_memory(work, layout).per_gpu.total <= budget
