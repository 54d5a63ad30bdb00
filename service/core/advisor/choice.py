"""The choice rules: which fitting candidate becomes the plan, and the sentence saying why.

Throughput first, as the ZeRO article's decision flow says: the least offload (a host step and
PCIe traffic every step cost more than any stage's communication; design.md: a higher stage
before offload), then the lowest ZeRO stage that fits (ZeRO-3 is the capacity option, paid for in
communication), then no checkpointing before checkpointing, then the largest micro-batch. The
``capacity`` policy takes the candidate that needs the least memory per GPU.
"""

from __future__ import annotations

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
