"""The choice rules: which fitting candidate becomes the plan, and the sentence saying why.

Throughput first, as the ZeRO article's decision flow says: the lowest ZeRO stage that fits (ZeRO-3
is the capacity option, paid for in communication), then the least offload, then no
checkpointing before checkpointing, then the largest micro-batch. The ``capacity`` policy takes
the candidate that needs the least memory per GPU.
"""

from __future__ import annotations

from service.core.advisor.models import Candidate, Policy, format_bytes


def offload_level(candidate: Candidate) -> int:
    if candidate.offload_param == "cpu":
        return 2
    return 1 if candidate.offload_optimizer == "cpu" else 0


def throughput_key(candidate: Candidate) -> tuple[int, int, bool, int]:
    return (
        candidate.zero_stage,
        offload_level(candidate),
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
    lower = [c for c in candidates if c.zero_stage < plan.zero_stage]
    first = f"ZeRO-{plan.zero_stage} is the lowest stage that fits ({need})"
    if lower:
        smallest = min(c.per_gpu_bytes.total for c in lower)
        first += f"; lower stages need at least {format_bytes(smallest)}"
    extras = _extras(plan)
    micro = plan.micro_batch_size
    return f"{first}. It uses {extras}, and micro-batch {micro} is the largest that fits."


def _extras(plan: Candidate) -> str:
    offload = {0: "no offload", 1: "optimizer offload to CPU", 2: "optimizer and parameter offload"}
    checkpointing = (
        "activation checkpointing" if plan.activation_checkpointing else "no checkpointing"
    )
    return f"{offload[offload_level(plan)]} and {checkpointing}"
