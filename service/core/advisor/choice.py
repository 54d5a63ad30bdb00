"""The choice rules: which fitting candidate becomes the plan, and the sentence saying why.

Throughput first: the fitting candidate with the least predicted time per sample (the step-time
model, step_time.py). Within ``TIE_TOLERANCE`` of the fastest, the ZeRO article's preferences
decide: the least offload, no checkpointing before checkpointing, the lowest stage (ZeRO-2
before ZeRO-1), then the largest micro-batch. The ``capacity`` policy takes the candidate that
needs the least memory per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.core.advisor.models import PHASE_WORDS, Candidate, Policy, format_bytes

# Plans predicted this close are a tie: below it the terms that differ between two plans on
# one GPU (ZeRO-0's per-tensor overflow sync, a bucket copy) are smaller than the terms they
# share, and the H200 runs' ZeRO-0/ZeRO-2 pairs differ by 0.7% and 5.1% (docs/advisor.md).
TIE_TOLERANCE = 0.02


def offload_level(candidate: Candidate) -> int:
    if candidate.offload_param == "cpu":
        return 2
    return 1 if candidate.offload_optimizer == "cpu" else 0


def seconds_per_sample(candidate: Candidate) -> float:
    """Predicted time per sample; a stored plan without a prediction sorts by relative cost."""
    if candidate.step_seconds is None:
        return candidate.relative_cost
    samples = candidate.micro_batch_size * candidate.gradient_accumulation_steps
    return candidate.step_seconds / samples


# Stages in the article's order, except that ZeRO-2 comes before ZeRO-1: it moves the same
# bytes (the ZeRO paper: P_os+g communicates what data parallelism does) and holds less, so
# ZeRO-1 never wins a tie against it (on one GPU the two are the same plan).
STAGE_PREFERENCE = {0: 0, 2: 1, 1: 2, 3: 3}


def preference_key(candidate: Candidate) -> tuple[int, bool, int, int]:
    """The article's order, used between plans the time model cannot tell apart."""
    return (
        offload_level(candidate),
        candidate.activation_checkpointing,
        STAGE_PREFERENCE[candidate.zero_stage],
        -candidate.micro_batch_size,
    )


def throughput_key(candidate: Candidate) -> tuple[float, tuple[int, bool, int, int]]:
    return (seconds_per_sample(candidate), preference_key(candidate))


def capacity_key(candidate: Candidate) -> tuple[int, float]:
    return (candidate.per_gpu_bytes.total, candidate.relative_cost)


def choose(fitting: list[Candidate], policy: Policy) -> Candidate:
    if policy == "capacity":
        return min(fitting, key=capacity_key)
    fastest = min(seconds_per_sample(c) for c in fitting)
    ties = [c for c in fitting if seconds_per_sample(c) <= fastest * (1.0 + TIE_TOLERANCE)]
    return min(ties, key=lambda c: (preference_key(c), seconds_per_sample(c)))


def explain(plan: Candidate, candidates: list[Candidate], policy: Policy, budget: int) -> str:
    """One or two sentences: why this plan, and the runner-up in numbers."""
    need = f"{format_bytes(plan.per_gpu_bytes.total)} of {format_bytes(budget)} usable per GPU"
    if policy == "capacity":
        return (
            f"The capacity policy takes the most memory-saving configuration: {plan.label()} "
            f"needs {need}."
        )
    fastest = min(seconds_per_sample(c) for c in candidates if c.fits)
    rank = "is the fastest plan" if seconds_per_sample(plan) <= fastest else "ties the fastest plan"
    first = f"{describe(plan)} {rank} that fits, {_speed(plan)} predicted ({need}"
    first += f"{_at_peak(plan)})"
    others = [
        c for c in candidates if c.fits and _family(c) != _family(plan) and not _same_speed(c, plan)
    ]
    if others:
        runner = min(others, key=throughput_key)
        first += f"; {describe(runner)} would be {_speed(runner)}"
        if seconds_per_sample(runner) < seconds_per_sample(plan):
            first += f" (within {TIE_TOLERANCE:.0%}, a tie the article's order breaks)"
    faster = [c for c in candidates if not c.fits and throughput_key(c) < throughput_key(plan)]
    if faster:
        best = min(faster, key=throughput_key)
        first += (
            f"; {describe(best)} would be {_speed(best)} but needs "
            f"{format_bytes(best.per_gpu_bytes.total)}{_at_peak(best)}"
        )
    return f"{first}. Micro-batch {plan.micro_batch_size}, accumulation " + (
        f"{plan.gradient_accumulation_steps}."
    )


def describe(candidate: Candidate) -> str:
    """E.g. "ZeRO-2 without checkpointing", "ZeRO-3 with optimizer offload and checkpointing"."""
    level = offload_level(candidate)
    offload = f" with {_OFFLOAD[level]}" if level else ""
    joint = " and" if level else " with"
    checkpointing = f"{joint} checkpointing" if candidate.activation_checkpointing else ""
    if not level and not candidate.activation_checkpointing:
        checkpointing = " without checkpointing"
    return f"ZeRO-{candidate.zero_stage}{offload}{checkpointing}"


def _same_speed(a: Candidate, b: Candidate) -> bool:
    """Predicted alike to 0.1% (ZeRO-1 and ZeRO-2 on one GPU): no news as a runner-up."""
    return abs(seconds_per_sample(a) - seconds_per_sample(b)) <= 1e-3 * seconds_per_sample(b)


def _family(candidate: Candidate) -> tuple[int, int, bool]:
    return (candidate.zero_stage, offload_level(candidate), candidate.activation_checkpointing)


def _speed(candidate: Candidate) -> str:
    """E.g. "42.7k tokens/s"; a stored plan without a prediction gives its relative cost."""
    rate = candidate.tokens_per_second
    if rate is None:
        return f"relative cost {candidate.relative_cost:.2f}"
    if rate >= 1e6:
        return f"{rate / 1e6:.2f}M tokens/s"
    return f"{rate / 1e3:.1f}k tokens/s" if rate >= 1e3 else f"{rate:.0f} tokens/s"


def _at_peak(candidate: Candidate) -> str:
    """Where the candidate's peak is, e.g. ", peak in the optimizer step"."""
    phase = candidate.peak_phase
    return f", peak {PHASE_WORDS[phase]}" if phase else ""


_OFFLOAD = {0: "no offload", 1: "optimizer offload", 2: "optimizer and parameter offload"}


@dataclass(frozen=True)
class Replanning:
    """What a failed plan taught, as the choice of the next plan needs it.

    ``correction`` scales every prediction of this job (observed need / predicted peak, at least
    1); ``must_save`` is what the next plan must need less than ``failed`` after correction (the
    bytes that were missing); ``budget`` caps the corrected need; ``tried`` are the identities of
    plans already run (see ``plan_identity``); ``on_host`` measures host memory per node instead
    of the device; ``at_initialize``: it failed inside deepspeed.initialize, so the correction
    came from that phase's prediction and scales only it.
    """

    failed: Candidate
    correction: float
    must_save: int
    budget: int
    tried: frozenset[tuple[object, ...]]
    on_host: bool = False
    at_initialize: bool = False
    offload_budget: int | None = None  # the device budget of plans with optimizer offload

    def budget_for(self, candidate: Candidate) -> int:
        if offload_level(candidate) and self.offload_budget is not None:
            return min(self.budget, self.offload_budget)
        return self.budget

    def need(self, candidate: Candidate) -> int:
        if self.on_host:
            return int(candidate.cpu_bytes_per_node * self.correction)
        total = candidate.per_gpu_bytes.total
        if self.at_initialize and candidate.initialize_bytes:
            return max(int(candidate.initialize_bytes * self.correction), total)
        return int(total * self.correction)

    def saving(self, candidate: Candidate) -> int:
        return self.need(self.failed) - self.need(candidate)

    def acceptable(self, candidate: Candidate) -> bool:
        return (
            plan_identity(candidate) not in self.tried
            and self.need(candidate) <= self.budget_for(candidate)
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
