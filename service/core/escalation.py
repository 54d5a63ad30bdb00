"""Re-planning after an out-of-memory failure: the next plan, chosen with the failure's evidence.

A failure is evidence (see ``failures.Diagnosis``): the bytes an allocation tried, what the
device had free, what this process and other processes held, the limit. The advisor is asked
again with it:

- an OOM caused by other processes on the GPU (this process's need fits the device) keeps the
  plan: the attempt is retried, not escalated;
- the observed need (in use + tried) over the failed plan's predicted peak corrects every
  prediction for this job (never below 1);
- the next plan is predicted to fit with that correction, saves at least the missing bytes
  (where unknown, ``MIN_SAVING_FRACTION`` of the failed plan's need), was never tried, and is
  the fastest (lowest ``relative_cost``) in the earliest tier of the ZeRO article's order:
  checkpointing or a smaller micro-batch with more accumulation, then a higher stage, then
  optimizer offload, then parameter offload (``choice.replan_tier``);
- on a cluster without GPUs the host is the device: the same re-planning (stage, buckets,
  micro-batch, checkpointing); a host OOM on a GPU cluster re-plans host memory per node;
- when nothing qualifies, the decision says so with the numbers.

Pure: it prices plans with the advisor's memory model and never looks at the cluster. Pins in
the spec do not bind it (it exists to leave the first choice).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from service.core.advisor.advise import without_pins
from service.core.advisor.candidates import (
    Budgets,
    enumerate_layouts,
    evaluate_layout,
    knobs_of,
    layout_of,
)
from service.core.advisor.choice import Replanning, choose_replanned, plan_identity
from service.core.advisor.layout import Layout, Workload, model_sized_knobs
from service.core.advisor.models import Candidate, format_bytes
from service.core.advisor.workload import (
    budget_bytes,
    build_workload,
    host_budget_bytes,
    usable_device_bytes,
)
from service.core.clusters import ClusterProfile
from service.core.spec import JobSpec

MIN_SAVING_FRACTION = 0.05  # without a missing-bytes figure, a plan must save at least this
# At rank start "neither free nor reserved by PyTorch" includes the rank's own CUDA context
# (a few hundred MiB); only more than this is counted as other processes' memory.
CONTEXT_ALLOWANCE = 1024**3
MIN_BUCKET = 10_000_000  # below this, smaller buckets cost throughput and save little
BUCKET_DIVISOR = 4
# Settings re-planning itself changes; a user's override of them would undo the new plan.
LADDER_OWNED = frozenset(
    {"stage", "offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_param"}
)


@dataclass(frozen=True)
class Evidence:
    """What an out-of-memory failure measured, in bytes; None where it did not say."""

    failure_class: str
    missing_bytes: int | None = None
    tried_bytes: int | None = None
    process_bytes: int | None = None  # held by the failed process (device) or resident (host)
    capacity_bytes: int | None = None  # the device's total (or the allowed fraction)
    other_processes_bytes: int = 0  # held on the device by other processes
    phase: str | None = None  # "initialize": it failed inside deepspeed.initialize

    @property
    def observed_need(self) -> int | None:
        """What the failed plan needed at least: what it held plus what it asked for."""
        if self.process_bytes is None or self.tried_bytes is None:
            return None
        return self.process_bytes + self.tried_bytes

    def describe(self) -> str:
        figures = [
            ("tried", self.tried_bytes),
            ("missing", self.missing_bytes),
            ("this process held", self.process_bytes),
            ("other processes held", self.other_processes_bytes or None),
            ("device total", self.capacity_bytes),
        ]
        return ", ".join(f"{name} {format_bytes(n)}" for name, n in figures if n is not None)


def evidence_from(record: dict[str, Any], runtime: dict[str, Any]) -> Evidence:
    """Evidence from a stored diagnosis (``Diagnosis.as_record``) and the runtime's reports."""
    numbers: dict[str, int] = record.get("numbers", {})
    started = [d.get("numbers", {}) for d in runtime.get("devices", {}).values()]
    others_at_start = max((n.get("other_processes_bytes", 0) for n in started), default=0)
    if others_at_start < CONTEXT_ALLOWANCE:  # the rank's own CUDA context, not a neighbour
        others_at_start = 0
    held = numbers.get("process_bytes", numbers.get("rss_bytes"))
    return Evidence(
        failure_class=str(record.get("failure_class", "")),
        missing_bytes=record.get("missing_bytes"),
        tried_bytes=numbers.get("tried_bytes"),
        process_bytes=held,
        capacity_bytes=numbers.get("allowed_bytes", numbers.get("capacity_bytes")),
        other_processes_bytes=max(numbers.get("other_processes_bytes", 0), others_at_start),
        phase=record.get("phase"),
    )


@dataclass(frozen=True)
class Decision:
    """``escalate`` to ``plan``, ``retry`` the same plan, or ``stop``; ``reason`` has numbers."""

    action: Literal["escalate", "retry", "stop"]
    reason: str
    plan: Candidate | None = None
    change: str = ""  # what differs from the failed plan, in words


def replan(
    spec: JobSpec,
    profile: ClusterProfile,
    failed: Candidate,
    evidence: Evidence,
    tried: list[Candidate],
) -> Decision:
    """The decision after ``failed`` ran out of memory (whether escalation applies at all is
    ``service.core.outcomes``'s rule)."""
    if (crowded := _crowded_out(failed, evidence)) is not None:
        return crowded
    work = build_workload(spec, profile)
    replan_spec = _replan_spec(spec)
    on_host = evidence.failure_class == "OOM_HOST" and not work.on_cpu
    budgets = Budgets(
        budget_bytes(profile), host_budget_bytes(profile), budget_bytes(profile, offload=True)
    )
    replanning = _replanning(failed, evidence, tried, budgets, on_host)
    candidates = [
        evaluate_layout(replan_spec, work, layout, budgets)
        for layout in _layouts(replan_spec, work, failed)
    ]
    chosen = choose_replanned(candidates, replanning)
    if chosen is None:
        return Decision("stop", _nothing_fits(candidates, replanning))
    return Decision("escalate", _why(chosen, replanning), chosen, describe_change(failed, chosen))


def _crowded_out(failed: Candidate, evidence: Evidence) -> Decision | None:
    """Other processes held the GPU and this process's need fits the device: keep the plan."""
    if evidence.failure_class != "OOM_GPU" or not evidence.other_processes_bytes:
        return None
    capacity = evidence.capacity_bytes
    # held + tried is only a lower bound of the plan's need: the prediction may know more
    need = max(evidence.observed_need or 0, failed.per_gpu_bytes.total)
    offload = failed.offload_optimizer == "cpu"
    if capacity is None or need > usable_device_bytes(capacity, offload=offload):
        return None  # the plan would not fit even a free GPU with the usual headroom
    return Decision(
        "retry",
        f"other processes held {format_bytes(evidence.other_processes_bytes)} of the GPU's "
        f"{format_bytes(capacity)}; this plan needs {format_bytes(need)} (the larger of what "
        "it held and tried and its prediction), which fits a free GPU with the usual "
        "headroom: the plan is kept and the attempt retried",
        failed,
    )


def _replanning(
    failed: Candidate,
    evidence: Evidence,
    tried: list[Candidate],
    budgets: Budgets,
    on_host: bool,
) -> Replanning:
    at_init = evidence.phase == "initialize" and not on_host and bool(failed.initialize_bytes)
    predicted = failed.cpu_bytes_per_node if on_host else failed.per_gpu_bytes.total
    if at_init and failed.initialize_bytes:  # matched against the phase it failed in
        predicted = failed.initialize_bytes
    # One rank's resident bytes say nothing about a node's host total: no correction there.
    observed = None if on_host else evidence.observed_need
    correction = max(1.0, observed / predicted) if observed and predicted > 0 else 1.0
    budget = budgets.host_per_node if on_host else budgets.per_gpu
    offload_budget = budget if on_host else min(budget, budgets.per_gpu_offload or budget)
    if evidence.capacity_bytes and not on_host:  # the device the job really got
        budget = min(budget, usable_device_bytes(evidence.capacity_bytes))
        offload_budget = min(
            offload_budget, usable_device_bytes(evidence.capacity_bytes, offload=True)
        )
    must_save = evidence.missing_bytes
    if must_save is None:
        must_save = int(MIN_SAVING_FRACTION * predicted * correction)
    return Replanning(
        failed=failed,
        correction=correction,
        must_save=must_save,
        budget=budget,
        tried=frozenset(plan_identity(c) for c in [*tried, failed]),
        on_host=on_host,
        at_initialize=at_init,
        offload_budget=offload_budget,
    )


def _replan_spec(spec: JobSpec) -> JobSpec:
    """The job without pins, and without the user's overrides of what re-planning changes."""
    unpinned = without_pins(spec)
    user_zero = spec.zero.overrides.get("zero_optimization", {})
    zero = {k: v for k, v in user_zero.items() if k not in LADDER_OWNED}
    overrides = {**spec.zero.overrides, "zero_optimization": zero}
    if not zero:
        overrides.pop("zero_optimization")
    return unpinned.model_copy(
        update={"zero": unpinned.zero.model_copy(update={"overrides": overrides})}
    )


def _layouts(spec: JobSpec, work: Workload, failed: Candidate) -> list[Layout]:
    """Every layout the advisor enumerates, each also with lowered buckets and unpinned
    offload buffers, plus the failed plan's own layout with those changes."""
    base = layout_of(
        failed, knobs_of(failed, model_sized_knobs(work.shape.parameters, failed.zero_stage))
    )
    layouts: list[Layout] = []
    for layout in [base, *enumerate_layouts(spec, work)]:
        layouts.append(layout)
        if (lowered := lower_buckets(layout, work)) is not None:
            layouts.append(lowered)
        if layout.offload_optimizer and layout.knobs.pin_memory:
            layouts.append(replace(layout, knobs=replace(layout.knobs, pin_memory=False)))
    return layouts


def lower_buckets(layout: Layout, work: Workload) -> Layout | None:
    """Quarter the reduce/all-gather buckets and the stage-3 prefetch, not below MIN_BUCKET."""
    knobs = layout.knobs
    if layout.stage == 0 or knobs.reduce_bucket_size <= MIN_BUCKET:
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


def _why(chosen: Candidate, replanning: Replanning) -> str:
    what = "host memory per node" if replanning.on_host else "peak per rank"
    if replanning.at_initialize:
        what = "peak per rank (inside deepspeed.initialize, where it failed, or in training)"
    return (
        f"predicted {what} {format_bytes(replanning.need(replanning.failed))} -> "
        f"{format_bytes(replanning.need(chosen))} (x{replanning.correction:.2f} correction from "
        f"the observed need), saves {format_bytes(replanning.saving(chosen))} >= "
        f"{format_bytes(replanning.must_save)} needed, relative cost "
        f"{replanning.failed.relative_cost:.3f} -> {chosen.relative_cost:.3f}"
    )


def _nothing_fits(candidates: list[Candidate], replanning: Replanning) -> str:
    fresh = [c for c in candidates if plan_identity(c) not in replanning.tried]
    head = (
        f"no untried plan is predicted to fit {format_bytes(replanning.budget)} with the "
        f"x{replanning.correction:.2f} correction and to save the "
        f"{format_bytes(replanning.must_save)} needed"
    )
    if not fresh:
        return head
    best = max(fresh, key=replanning.saving)
    return (
        f"{head}: the most saving, {best.label()}, needs "
        f"{format_bytes(replanning.need(best))} and saves {format_bytes(replanning.saving(best))}"
    )


def describe_change(old: Candidate, new: Candidate) -> str:
    """What differs between two plans, in the words of the ZeRO article's knobs."""
    changes = []
    if new.activation_checkpointing != old.activation_checkpointing:
        on = "on" if new.activation_checkpointing else "off"
        changes.append(f"activation checkpointing {on}")
    if new.micro_batch_size != old.micro_batch_size:
        changes.append(
            f"micro-batch {old.micro_batch_size} -> {new.micro_batch_size} (accumulation "
            f"{old.gradient_accumulation_steps} -> {new.gradient_accumulation_steps})"
        )
    if new.zero_stage != old.zero_stage:
        changes.append(f"ZeRO-{old.zero_stage} -> ZeRO-{new.zero_stage}")
    for part in ("optimizer", "param"):
        before, after = getattr(old, f"offload_{part}"), getattr(new, f"offload_{part}")
        if before != after:
            changes.append(f"{part} offload {before} -> {after}")
    changes += _knob_changes(old, new)
    return "; ".join(changes) or "the same layout"


def _knob_changes(old: Candidate, new: Candidate) -> list[str]:
    before = old.ds_config.get("zero_optimization", {})
    after = new.ds_config.get("zero_optimization", {})
    changes = []
    for key in ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size"):
        if key in before and key in after and before[key] != after[key]:
            changes.append(f"{key} {before[key]:,} -> {after[key]:,}")
    pinned = [
        (before.get(k) or {}).get("pin_memory") != (after.get(k) or {}).get("pin_memory")
        for k in ("offload_optimizer", "offload_param")
        if k in before and k in after
    ]
    if any(pinned):
        changes.append("unpinned offload buffers")
    return changes
