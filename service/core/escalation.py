"""The escalation ladder: after an out-of-memory failure, the next configuration to try.

On ``OOM_GPU`` the rungs are, cheapest first: activation checkpointing, smaller buckets and
prefetch, the next ZeRO stage, optimizer offload, parameter offload, then half the micro-batch
with twice the accumulation (the global batch never changes). On ``OOM_HOST``: unpinned CPU
buffers, then no offload. A rung is taken only when the advisor predicts that it fits and that
it needs less memory than the configuration that failed; no configuration is tried twice. When no
single rung fits, rungs are climbed together in order until the result fits.

Pure: it prices rungs with the advisor's memory model and never looks at the cluster. Pins in the
spec do not bind the ladder (it exists to leave the first choice); ``escalation.enabled`` and
``escalation.max_attempts`` do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from service.core.advisor.candidates import Budgets, evaluate_layout, knobs_of, layout_of
from service.core.advisor.constants import DEFAULT_HEADROOM
from service.core.advisor.layout import Layout, Workload, model_sized_knobs
from service.core.advisor.models import Candidate
from service.core.advisor.workload import budget_bytes, build_workload, host_budget_bytes
from service.core.clusters import ClusterProfile
from service.core.spec import JobSpec

MIN_BUCKET = 10_000_000  # below this, smaller buckets cost throughput and save little
BUCKET_DIVISOR = 4
# Settings the ladder itself changes; a user's override of them would undo a rung.
LADDER_OWNED = frozenset(
    {"stage", "offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_param"}
)

Step = Callable[[Layout, Workload], Layout | None]


def turn_on_checkpointing(layout: Layout, _: Workload) -> Layout | None:
    return None if layout.checkpointing else replace(layout, checkpointing=True)


def lower_buckets(layout: Layout, work: Workload) -> Layout | None:
    """Quarter the buckets once; a config already below the advisor's sizes was lowered before."""
    knobs = layout.knobs
    default = model_sized_knobs(work.shape.parameters, layout.stage).reduce_bucket_size
    if layout.stage == 0 or knobs.reduce_bucket_size <= MIN_BUCKET:
        return None
    if knobs.reduce_bucket_size < default:
        return None
    smaller = replace(
        knobs,
        reduce_bucket_size=max(MIN_BUCKET, knobs.reduce_bucket_size // BUCKET_DIVISOR),
        allgather_bucket_size=max(MIN_BUCKET, knobs.allgather_bucket_size // BUCKET_DIVISOR),
        prefetch_bucket_size=min(
            knobs.prefetch_bucket_size,
            max(MIN_BUCKET, knobs.prefetch_bucket_size // BUCKET_DIVISOR),
        ),
    )
    return replace(layout, knobs=smaller)


def next_stage(layout: Layout, _: Workload) -> Layout | None:
    if layout.stage >= 3:
        return None
    return replace(layout, stage=layout.stage + 1, knobs=replace(layout.knobs, overlap_comm=True))


def offload_optimizer(layout: Layout, _: Workload) -> Layout | None:
    if layout.offload_optimizer or layout.stage == 0:
        return None
    return replace(layout, offload_optimizer=True)


def offload_params(layout: Layout, _: Workload) -> Layout | None:
    if layout.offload_param or layout.stage != 3:
        return None
    return replace(layout, offload_optimizer=True, offload_param=True)


def halve_micro_batch(layout: Layout, work: Workload) -> Layout | None:
    if layout.micro_batch % 2:
        return None
    return replace(
        layout, micro_batch=layout.micro_batch // 2, accumulation=layout.accumulation * 2
    )


def unpin_host_buffers(layout: Layout, _: Workload) -> Layout | None:
    if not layout.offload_optimizer or not layout.knobs.pin_memory:
        return None
    return replace(layout, knobs=replace(layout.knobs, pin_memory=False))


def leave_offload(layout: Layout, _: Workload) -> Layout | None:
    if not layout.offload_optimizer:
        return None
    return replace(layout, offload_optimizer=False, offload_param=False)


GPU_LADDER: tuple[tuple[Step, str], ...] = (
    (turn_on_checkpointing, "turn on activation checkpointing"),
    (lower_buckets, "lower the reduce/all-gather buckets and the stage-3 prefetch"),
    (next_stage, "move to the next ZeRO stage"),
    (offload_optimizer, "offload the optimizer to the CPU"),
    (offload_params, "offload the parameters to the CPU"),
    (halve_micro_batch, "halve the micro-batch and double the accumulation"),
)
HOST_LADDER: tuple[tuple[Step, str], ...] = (
    (unpin_host_buffers, "stop pinning the CPU offload buffers"),
    (leave_offload, "leave CPU offload"),
)
LADDERS = {"OOM_GPU": GPU_LADDER, "OOM_HOST": HOST_LADDER}


def next_rung(
    spec: JobSpec,
    profile: ClusterProfile,
    current: Candidate,
    failure_class: str,
    tried: list[Candidate],
) -> tuple[Candidate, str] | None:
    """The next candidate after ``current`` failed with ``failure_class``, and the step's name."""
    ladder = LADDERS.get(failure_class)
    if ladder is None or not spec.escalation.enabled:
        return None
    if len({_identity(c) for c in [*tried, current]}) >= spec.escalation.max_attempts:
        return None
    work = build_workload(spec, profile)
    start = layout_of(current, knobs_of(current, model_sized_knobs(work.shape.parameters, 0)))
    pricing = _Pricing(spec, work, profile, current, tried, failure_class)
    return _single_step(ladder, start, pricing) or _climb(ladder, start, pricing)


class _Pricing:
    """Evaluates layouts and decides which of them the ladder may take."""

    def __init__(
        self,
        spec: JobSpec,
        work: Workload,
        profile: ClusterProfile,
        current: Candidate,
        tried: list[Candidate],
        failure_class: str,
    ) -> None:
        self.spec, self.work, self.current = spec, work, current
        self.host_failure = failure_class == "OOM_HOST"
        self.budgets = Budgets(
            budget_bytes(profile, DEFAULT_HEADROOM), host_budget_bytes(profile, DEFAULT_HEADROOM)
        )
        self.seen = {_identity(c) for c in [*tried, current]}

    def evaluate(self, layout: Layout) -> Candidate:
        return evaluate_layout(_with_knobs(self.spec, layout), self.work, layout, self.budgets)

    def acceptable(self, candidate: Candidate) -> bool:
        return candidate.fits and self.saves(candidate) and _identity(candidate) not in self.seen

    def saves(self, candidate: Candidate) -> bool:
        """A GPU rung must need less GPU memory; a host rung must not need more host memory."""
        if self.host_failure:
            return candidate.cpu_bytes_per_node <= self.current.cpu_bytes_per_node
        return candidate.per_gpu_bytes.total < self.current.per_gpu_bytes.total


def _single_step(
    ladder: tuple[tuple[Step, str], ...], start: Layout, pricing: _Pricing
) -> tuple[Candidate, str] | None:
    for step, description in ladder:
        layout = step(start, pricing.work)
        while layout is not None:
            if pricing.acceptable(candidate := pricing.evaluate(layout)):
                return candidate, description
            # ZeRO-1 and ZeRO-2 measure alike in DeepSpeed 0.19: try the stage after as well
            layout = next_stage(layout, pricing.work) if step is next_stage else None
    return None


def _climb(
    ladder: tuple[tuple[Step, str], ...], start: Layout, pricing: _Pricing
) -> tuple[Candidate, str] | None:
    layout, taken = start, []
    for step, description in ladder:
        climbed = step(layout, pricing.work)
        if climbed is None:
            continue
        layout = climbed
        taken.append(description)
        if pricing.acceptable(candidate := pricing.evaluate(layout)):
            return candidate, "; then ".join(taken)
    return None


def _with_knobs(spec: JobSpec, layout: Layout) -> JobSpec:
    """The spec whose overrides carry the layout's knobs, so rendering keeps them."""
    user_zero = spec.zero.overrides.get("zero_optimization", {})
    zero = {k: v for k, v in user_zero.items() if k not in LADDER_OWNED}
    if layout.stage > 0:
        zero.update(_knob_settings(layout))
    overrides = {**spec.zero.overrides, "zero_optimization": zero}
    zero_spec = spec.zero.model_copy(update={"overrides": overrides})
    return spec.model_copy(update={"zero": zero_spec})


def _knob_settings(layout: Layout) -> dict[str, object]:
    knobs = layout.knobs
    settings: dict[str, object] = {
        "reduce_bucket_size": knobs.reduce_bucket_size,
        "overlap_comm": knobs.overlap_comm,
    }
    if layout.stage == 3:
        settings["stage3_prefetch_bucket_size"] = knobs.prefetch_bucket_size
    else:
        settings["allgather_bucket_size"] = knobs.allgather_bucket_size
    if layout.offload_optimizer:
        settings["offload_optimizer"] = {"pin_memory": knobs.pin_memory}
    if layout.offload_param:
        settings["offload_param"] = {"pin_memory": knobs.pin_memory}
    return settings


def _identity(candidate: Candidate) -> tuple[object, ...]:
    zero = candidate.ds_config.get("zero_optimization", {})
    knobs = tuple(sorted((k, str(v)) for k, v in zero.items()))
    return (
        candidate.zero_stage,
        candidate.offload_optimizer,
        candidate.offload_param,
        candidate.activation_checkpointing,
        candidate.micro_batch_size,
        knobs,
    )
