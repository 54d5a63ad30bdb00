"""Why the plan won (``zeropilot advise --explain``): the best of every other stage, offload and
checkpointing, and every other micro-batch of the plan's own, each with why it lost: it does
not fit (and by how much), it is slower (by how much per sample, and whether that is inside the
calibration's typical error), or it ties and the ZeRO article's order prefers the plan. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from service.core.advisor.candidates import Budgets
from service.core.advisor.choice import (
    TIE_TOLERANCE,
    capacity_key,
    offload_level,
    preference_key,
    seconds_per_sample,
    throughput_key,
)
from service.core.advisor.models import Advice, Candidate, format_bytes

Outcome = Literal["chosen", "does not fit", "slower", "tie"]


@dataclass(frozen=True)
class Rival:
    candidate: Candidate
    outcome: Outcome
    why: str
    slower_by: float | None  # its time per sample over the plan's, minus 1 (None: not predicted)


def rivals(advice: Advice, budgets: Budgets, typical_error: float = 0.0) -> list[Rival]:
    """The plan first, then the best of each other family, then the plan's other micro-batches."""
    plan = advice.plan
    families: dict[tuple[int, int, bool], list[Candidate]] = {}
    for c in advice.candidates:
        families.setdefault(_family(c), []).append(c)
    others = [_best(own) for key, own in families.items() if key != _family(plan)]
    micro = [c for c in families.get(_family(plan), []) if c != plan]
    chosen = Rival(plan, "chosen", _why_chosen(plan, advice.candidates), 0.0)
    return [
        chosen,
        *(_with_unfit_faster(judge(c, plan, budgets, typical_error), families, budgets)
          for c in sorted(others, key=throughput_key)),
        *(judge(c, plan, budgets, typical_error)
          for c in sorted(micro, key=lambda c: c.micro_batch_size)),
    ]  # fmt: skip


def judge(c: Candidate, plan: Candidate, budgets: Budgets, typical_error: float) -> Rival:
    """Why ``c`` is not the plan."""
    slower = _slower_by(c, plan)
    if not c.fits:
        faster = f"; it would be {-slower:.0%} faster" if slower is not None and slower < 0 else ""
        return Rival(c, "does not fit", f"does not fit: {_shortfall(c, budgets)}{faster}", slower)
    if slower is not None and slower > TIE_TOLERANCE:
        within = (
            f", inside the calibration's typical error ({typical_error:.0%}): the choice is close"
            if slower <= typical_error
            else ""
        )
        return Rival(c, "slower", f"slower: {slower:+.1%} time per sample{within}", slower)
    if preference_key(c) < preference_key(plan):  # preferred, but outside the fastest's tie
        why = f"slower: {slower or 0:+.1%} time per sample, outside the tie with the fastest"
        return Rival(c, "slower", why, slower)
    words = "the article's order prefers " + _preferred(plan, c)
    return Rival(c, "tie", f"ties within {TIE_TOLERANCE:.0%}: {words}", slower)


def _with_unfit_faster(
    rival: Rival, families: dict[tuple[int, int, bool], list[Candidate]], budgets: Budgets
) -> Rival:
    """A slower family says why its faster micro-batch is not the plan: it does not fit."""
    c = rival.candidate
    faster = [
        o for o in families[_family(c)] if not o.fits and throughput_key(o) < throughput_key(c)
    ]
    if not faster or rival.outcome != "slower":  # a tie or a misfit needs no more words
        return rival
    best = min(faster, key=throughput_key)
    unfit = f"its mb={best.micro_batch_size} does not fit: {_shortfall(best, budgets)}"
    return Rival(c, rival.outcome, f"{rival.why}; {unfit}", rival.slower_by)


def _why_chosen(plan: Candidate, candidates: list[Candidate]) -> str:
    fastest = min((c for c in candidates if c.fits), key=seconds_per_sample)
    if seconds_per_sample(fastest) >= seconds_per_sample(plan):
        return "chosen: the least time per sample of those that fit"
    return f"chosen: ties the fastest that fits ({fastest.label()}), preferred by the article"


def _best(own: list[Candidate]) -> Candidate:
    """A family's fastest that fits; when none fits, the one closest to fitting."""
    fitting = [c for c in own if c.fits]
    return min(fitting, key=throughput_key) if fitting else min(own, key=capacity_key)


def _family(c: Candidate) -> tuple[int, int, bool]:
    return (c.zero_stage, offload_level(c), c.activation_checkpointing)


def _slower_by(c: Candidate, plan: Candidate) -> float | None:
    if c.step_seconds is None or plan.step_seconds is None:
        return None
    return seconds_per_sample(c) / seconds_per_sample(plan) - 1


def _shortfall(c: Candidate, budgets: Budgets) -> str:
    device = budgets.per_gpu
    if c.offload_optimizer == "cpu" and budgets.per_gpu_offload is not None:
        device = min(device, budgets.per_gpu_offload)
    if c.per_gpu_bytes.total > device:
        need, usable = format_bytes(c.per_gpu_bytes.total), format_bytes(device)
        return f"needs {need} per GPU of {usable} usable"
    need, usable = format_bytes(c.cpu_bytes_per_node), format_bytes(budgets.host_per_node)
    return f"needs {need} of host memory per node of {usable} usable"


def _preferred(plan: Candidate, c: Candidate) -> str:
    """The first of the article's preferences on which the plan beats ``c``, in words."""
    mine, theirs = preference_key(plan), preference_key(c)
    if mine[0] != theirs[0]:
        return f"{_OFFLOAD_WORDS[mine[0]]} before {_OFFLOAD_WORDS[theirs[0]]}"
    if mine[1] != theirs[1]:
        return "no activation checkpointing before checkpointing"
    if mine[2] != theirs[2]:
        return f"ZeRO-{plan.zero_stage} before ZeRO-{c.zero_stage}"
    if mine[3] != theirs[3]:
        return f"the larger micro-batch ({plan.micro_batch_size} before {c.micro_batch_size})"
    return "neither; the plan is predicted no slower"


_OFFLOAD_WORDS = ("no offload", "optimizer offload", "optimizer and parameter offload")
