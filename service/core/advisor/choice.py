"""The choice rules: which fitting candidate becomes the plan, and the sentence saying why.

Throughput first, as the ZeRO article's decision flow says: the least offload (a host step and
PCIe traffic every step cost more than any stage's communication; design.md: a higher stage
before offload), then the lowest ZeRO stage that fits (ZeRO-3 is the capacity option, paid for in
communication), then no checkpointing before checkpointing, then the largest micro-batch. The
``capacity`` policy takes the candidate that needs the least memory per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.core.advisor.models import PHASE_WORDS, Candidate, Policy, format_bytes


def offload_level(candidate: Candidate) -> int:
    if candidate.offload_param == "cpu":
        return 2
    return 1 if candidate.offload_optimizer == "cpu" else 0


def throughput_key(candidate: Candidate) -> tuple[int, int, bool, int]:
    return (
        offload_level(candidate),
        candidate.zero_stage,
        candidate.activation_checkpointing,
        -candidate.micro_batch_size,
    )


def capacity_key(candidate: Candidate) -> tuple[int, float]:
    return (candidate.per_gpu_bytes.total, candidate.relative_cost)


def choose(fitting: list[Candidate], policy: Policy) -> Candidate:
    key = capacity_key if policy == "capacity" else throughput_key
    return min(fitting, key=key)


def explain(plan: Candidate, candidates: list[Candidate], policy: Policy, budget: int) -> str:
    """One or two sentences: why this plan."""
    need = f"{format_bytes(plan.per_gpu_bytes.total)} of {format_bytes(budget)} usable per GPU"
    if policy == "capacity":
        return (
            f"The capacity policy takes the most memory-saving configuration: {plan.label()} "
            f"needs {need}."
        )
    level = offload_level(plan)
    lower = [c for c in candidates if c.zero_stage < plan.zero_stage and offload_level(c) == level]
    qualifier = " without offload" if level == 0 else f" with {_OFFLOAD[level]}"
    first = f"ZeRO-{plan.zero_stage} is the lowest stage that fits{qualifier} ({need}"
    first += f"{_at_peak(plan)})"
    less_offload = [c for c in candidates if offload_level(c) < level]
    if less_offload:
        closest = min(less_offload, key=lambda c: c.per_gpu_bytes.total)
        first = (
            f"Nothing fits with less offload (the least needs "
            f"{format_bytes(closest.per_gpu_bytes.total)}{_at_peak(closest)}); {first}"
        )
    if lower:
        smallest = min(lower, key=lambda c: c.per_gpu_bytes.total)
        first += (
            f"; lower stages need at least {format_bytes(smallest.per_gpu_bytes.total)}"
            f"{_at_peak(smallest)}"
        )
    extras = _extras(plan)
    micro = plan.micro_batch_size
    return f"{first}. It uses {extras}, and micro-batch {micro} is the largest that fits."


def _at_peak(candidate: Candidate) -> str:
    """Where the candidate's peak is, e.g. ", peak in the optimizer step"."""
    phase = candidate.peak_phase
    return f", peak {PHASE_WORDS[phase]}" if phase else ""


_OFFLOAD = {0: "no offload", 1: "optimizer offload to CPU", 2: "optimizer and parameter offload"}


def _extras(plan: Candidate) -> str:
    checkpointing = (
        "activation checkpointing" if plan.activation_checkpointing else "no checkpointing"
    )
    return f"{_OFFLOAD[offload_level(plan)]} and {checkpointing}"


@dataclass(frozen=True)
class Replanning:
    """What a failed plan taught, as the choice of the next plan needs it.

    ``correction`` scales every prediction of this job (observed need / predicted peak, at least
    1); ``must_save`` is what the next plan must need less than ``failed`` after correction (the
    bytes that were missing); ``budget`` caps the corrected need; ``tried`` are the identities of
    plans already run (see ``plan_identity``); ``on_host`` measures host memory per node instead
    of the device.
    """

    failed: Candidate
    correction: float
    must_save: int
    budget: int
    tried: frozenset[tuple[object, ...]]
    on_host: bool = False

    def need(self, candidate: Candidate) -> int:
        raw = candidate.cpu_bytes_per_node if self.on_host else candidate.per_gpu_bytes.total
        return int(raw * self.correction)

    def saving(self, candidate: Candidate) -> int:
        return self.need(self.failed) - self.need(candidate)

    def acceptable(self, candidate: Candidate) -> bool:
        return (
            plan_identity(candidate) not in self.tried
            and self.need(candidate) <= self.budget
            and self.saving(candidate) >= max(self.must_save, 1)
        )


def replan_tier(candidate: Candidate, failed: Candidate) -> int:
    """The ZeRO article's order after an OOM: checkpointing or a smaller micro-batch at the same
    stage (0), a higher stage (1), optimizer offload (2), parameter offload last (3)."""
    level = offload_level(candidate)
    if level > offload_level(failed):
        return 1 + level
    return 1 if candidate.zero_stage > failed.zero_stage else 0


def choose_replanned(candidates: list[Candidate], replanning: Replanning) -> Candidate | None:
    """The next plan: the earliest tier, then the fastest (lowest relative cost) acceptable one."""
    acceptable = [c for c in candidates if replanning.acceptable(c)]
    if not acceptable:
        return None
    return min(
        acceptable,
        key=lambda c: (replan_tier(c, replanning.failed), c.relative_cost, replanning.need(c)),
    )


def plan_identity(candidate: Candidate) -> tuple[object, ...]:
    """What makes two plans the same run: layout and the ZeRO settings rendered from it."""
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
