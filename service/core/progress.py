"""Is a running attempt still making progress? A hang is found against the job's own pace.

zeropilot receives every step a job reports and knows what a step of its plan should take: the
job's own steps once it has reported some (their median time), else the advisor's prediction.
An attempt with no new step for ``max(floor, factor x that step time)`` is hung; before its
first step it has ``first_step_s`` for loading and compiling. The words say what the verdict
rests on. Pure: the worker gathers the progress and acts on the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class HangRule:
    floor_s: float  # never hung sooner than this without a step
    factor: float  # times the step time
    first_step_s: float  # from the attempt's start to its first step


@dataclass(frozen=True)
class Progress:
    running_since: datetime
    last_step: int | None  # None: no step reported yet
    last_step_at: datetime | None
    step_s: float | None  # the step time expected now
    step_basis: str = ""  # where it comes from ("measured over 12 steps", "predicted")


def hang(progress: Progress, rule: HangRule, now: datetime) -> str | None:
    """Why the attempt is hung, in words, or None while it is within its allowance."""
    if progress.last_step is None or progress.last_step_at is None:
        waited = (now - progress.running_since).total_seconds()
        if waited <= rule.first_step_s:
            return None
        allowed = f"allowed {rule.first_step_s:.0f} s"
        return f"no step reported in the {waited:.0f} s since it started ({allowed})"
    waited = (now - progress.last_step_at).total_seconds()
    limit, why = allowance(progress, rule)
    if waited <= limit:
        return None
    return (
        f"no step for {waited:.0f} s after step {progress.last_step} (allowed {limit:.0f} s: {why})"
    )


def allowance(progress: Progress, rule: HangRule) -> tuple[float, str]:
    """How long a step may take here, and why."""
    if progress.step_s is None:
        return rule.floor_s, "the floor; no step time known"
    paced = rule.factor * progress.step_s
    if paced <= rule.floor_s:
        return rule.floor_s, f"the floor, over {rule.factor:g} x {_step(progress)}"
    return paced, f"{rule.factor:g} x {_step(progress)}"


def _step(progress: Progress) -> str:
    return f"a {progress.step_s:.2f} s step ({progress.step_basis})"
