"""Enumerate the layouts a job could run with, and evaluate one layout into a Candidate.

The space is ZeRO stage 0-3 x offload (none, optimizer, optimizer+parameters on ZeRO-3) x
activation checkpointing x micro-batch (the divisors of the per-rank batch when ``auto``). Fields
the user pinned in the spec narrow the space; ``evaluate_layout`` works for any layout, pinned
or not, so that the escalation ladder can price steps outside the user's first choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import isqrt
from typing import Any

from service.core.advisor.constants import CALIBRATION, Calibration
from service.core.advisor.cost import relative_cost
from service.core.advisor.layout import Knobs, Layout, Workload, model_sized_knobs
from service.core.advisor.memory import predict_memory
from service.core.advisor.models import Candidate
from service.core.advisor.render import knobs_from_overrides, render_ds_config
from service.core.advisor.step_time import predict_step_time
from service.core.spec import JobSpec, Offload

MAX_MICRO_OPTIONS = 12
OFFLOADS_BY_STAGE = {
    0: ((False, False),),
    1: ((False, False), (True, False)),
    2: ((False, False), (True, False)),
    3: ((False, False), (True, False), (True, True)),
}


@dataclass(frozen=True)
class Budgets:
    per_gpu: int
    host_per_node: int
    per_gpu_offload: int | None = None  # under offload, where the headroom differs (None: same)

    def device_for(self, layout: Layout) -> int:
        """The device budget this layout is held to."""
        if layout.offload_optimizer and self.per_gpu_offload is not None:
            return min(self.per_gpu, self.per_gpu_offload)
        return self.per_gpu


def micro_batch_options(spec: JobSpec, work: Workload) -> list[int]:
    """Micro-batches that divide the per-rank batch, honouring a pinned micro or accumulation."""
    per_rank = work.per_rank_batch
    training = spec.training
    if training.micro_batch_size != "auto":
        return [training.micro_batch_size]
    if training.gradient_accumulation_steps is not None:
        return [per_rank // training.gradient_accumulation_steps]
    divisors = divisors_of(per_rank)
    if len(divisors) <= MAX_MICRO_OPTIONS:
        return divisors
    powers = [d for d in divisors if d & (d - 1) == 0]  # keep 1, 2, 4, ... and the whole batch
    return sorted({*powers[: MAX_MICRO_OPTIONS - 1], per_rank})  # small ones decide fitting


def divisors_of(n: int) -> list[int]:
    """Every divisor of n, ascending, in O(sqrt(n)) steps (a batch can be large)."""
    small = [d for d in range(1, isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def stage_options(spec: JobSpec) -> list[int]:
    return [0, 1, 2, 3] if spec.zero.stage == "auto" else [spec.zero.stage]


def offload_options(spec: JobSpec, stage: int) -> list[tuple[bool, bool]]:
    wanted = {
        Offload.NONE: (False, False),
        Offload.OPTIMIZER: (True, False),
        Offload.ALL: (True, True),
    }
    allowed = OFFLOADS_BY_STAGE[stage]
    if spec.zero.offload == Offload.AUTO:
        return list(allowed)
    return [wanted[spec.zero.offload]] if wanted[spec.zero.offload] in allowed else []


def checkpointing_options(spec: JobSpec) -> list[bool]:
    pinned = spec.zero.activation_checkpointing
    return [False, True] if pinned == "auto" else [pinned]


def knobs_for(spec: JobSpec, work: Workload, stage: int) -> Knobs:
    return knobs_from_overrides(
        model_sized_knobs(work.shape.parameters, stage), spec.zero.overrides
    )


def enumerate_layouts(spec: JobSpec, work: Workload) -> list[Layout]:
    """Every layout the spec's pins allow."""
    micros = micro_batch_options(spec, work)
    layouts: list[Layout] = []
    for stage in stage_options(spec):
        knobs = knobs_for(spec, work, stage)
        for offload_optimizer, offload_param in offload_options(spec, stage):
            for checkpointing in checkpointing_options(spec):
                layouts.extend(
                    Layout(
                        stage,
                        offload_optimizer,
                        offload_param,
                        checkpointing,
                        micro,
                        work.per_rank_batch // micro,
                        knobs,
                    )
                    for micro in micros
                )
    return layouts


def evaluate_layout(
    spec: JobSpec,
    work: Workload,
    layout: Layout,
    budgets: Budgets,
    calibration: Calibration = CALIBRATION,
) -> Candidate:
    """Predict, price and render one layout."""
    prediction = predict_memory(work, layout, calibration)
    fits = (
        prediction.per_gpu.total <= budgets.device_for(layout)
        and prediction.cpu_bytes_per_node <= budgets.host_per_node
    )
    config: dict[str, Any] = render_ds_config(work, layout, spec.training, spec.zero.overrides)
    step = predict_step_time(work, layout, calibration)
    return Candidate.model_construct(  # every field is computed here; skip re-validation
        zero_stage=layout.stage,
        offload_optimizer="cpu" if layout.offload_optimizer else "none",
        offload_param="cpu" if layout.offload_param else "none",
        activation_checkpointing=layout.checkpointing,
        micro_batch_size=layout.micro_batch,
        gradient_accumulation_steps=layout.accumulation,
        per_gpu_bytes=prediction.per_gpu,
        cpu_bytes_per_node=prediction.cpu_bytes_per_node,
        fits=fits,
        relative_cost=relative_cost(work, layout, calibration, step),
        ds_config=config,
        peak_phase=prediction.phase,
        step_seconds=round(step.seconds, 6),
        tokens_per_second=round(step.tokens_per_second, 1),
        initialize_bytes=prediction.initialize_bytes or None,
    )


def layout_of(candidate: Candidate, knobs: Knobs) -> Layout:
    """The layout a candidate was made from, with the given knobs."""
    return Layout(
        stage=candidate.zero_stage,
        offload_optimizer=candidate.offload_optimizer == "cpu",
        offload_param=candidate.offload_param == "cpu",
        checkpointing=candidate.activation_checkpointing,
        micro_batch=candidate.micro_batch_size,
        accumulation=candidate.gradient_accumulation_steps,
        knobs=knobs,
    )


def knobs_of(candidate: Candidate, fallback: Knobs) -> Knobs:
    """The memory knobs as the candidate's rendered ds_config sets them."""
    return knobs_from_overrides(fallback, candidate.ds_config)
