"""How often a job saves when its checkpoint interval is ``auto``: Young's rule from measurements.

A save costs its time on every interval; an interruption costs the work since the last save,
half an interval on average. Young's interval, sqrt(2 x save time x mean time between
interruptions), makes the two equal. The save time is the median of the job's latest saves; the
mean time between interruptions is the cluster's: the GPU-hours zeropilot's attempts ran there
per interruption the cluster caused (a lost node, an NCCL failure, a hang), over the job's GPUs,
since a job of more GPUs is hit more often. Before any interruption is seen, the prior is
Llama 3's measured rate. The interval, in seconds, is held within bounds, then turned into
steps at the job's step time. docs/goodput.md shows a worked example.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.core.clusters import ClusterProfile
from service.core.spec import AUTO_INTERVAL, IntervalSetting

# Llama 3 (Meta, 2024): 419 unexpected interruptions in 54 days on 16,384 GPUs, one per
# ~50,000 GPU-hours: the rate assumed of a cluster that has not been seen to interrupt a job.
PRIOR_GPU_HOURS_PER_INTERRUPTION = 50_000.0
HISTORY_DAYS = 30  # the cluster's interruptions counted over this window
RECENT_SAVES = 5  # the save time: the median of the job's latest saves
FIRST_SAVE_S = 600.0  # before a save is measured: save after ten minutes, to measure one
MIN_INTERVAL_S = 300.0  # never more often: one early failure must not make every job save
MAX_INTERVAL_S = 4 * 3600.0  # never less often: what a user loses to an unseen failure
FALLBACK_STEPS = 100  # neither a measured nor a predicted step time: the old default
SETTLED_SHARE = 0.1  # a new interval within 10% of the current one is noise: kept as it is


@dataclass(frozen=True)
class Interruptions:
    """What zeropilot saw of a cluster in the window: GPU-hours its attempts ran, and how many
    of those attempts the cluster interrupted."""

    gpu_hours: float
    count: int

    def gpu_hours_each(self) -> float:
        """GPU-hours per interruption: observed once one is seen; before, the prior (or the
        hours seen without one, if more)."""
        if self.count == 0:
            return max(PRIOR_GPU_HOURS_PER_INTERRUPTION, self.gpu_hours)
        return self.gpu_hours / self.count


@dataclass(frozen=True)
class Cadence:
    steps: int
    reason: str  # in words, for the job's events
    automatic: bool = True  # chosen by zeropilot (auto), not set by a person


def fixed(steps: int) -> Cadence:
    return Cadence(steps, f"every {steps} steps, as set", automatic=False)


def resolve_setting(given: int | str | None, profile: ClusterProfile | None) -> IntervalSetting:
    """The spec's ``checkpoint.interval_steps`` as stored, else the cluster's default."""
    if given is None:
        return profile.checkpoint_interval_steps if profile else FALLBACK_STEPS
    if given == AUTO_INTERVAL:
        return "auto"
    return int(given)


def launch_steps(setting: int | str, step_s: float | None, total_steps: int | None) -> int:
    """The interval an attempt starts with (its first metrics report may change it)."""
    if setting == AUTO_INTERVAL:
        return first_cadence(step_s, total_steps).steps
    return int(setting)


def first_cadence(step_s: float | None, total_steps: int | None = None) -> Cadence:
    """Before any save of the job is measured: the first save after ``FIRST_SAVE_S``."""
    if not step_s:
        return Cadence(FALLBACK_STEPS, f"every {FALLBACK_STEPS} steps: no step time known yet")
    steps = _steps(FIRST_SAVE_S, step_s, total_steps)
    minutes = FIRST_SAVE_S / 60
    return Cadence(steps, f"every {steps} steps: a first save after {minutes:.0f} min to time one")


def young_cadence(
    save_s: float,
    step_s: float,
    gpus: int,
    seen: Interruptions,
    total_steps: int | None = None,
) -> Cadence:
    """Young's interval for this save time on this cluster, bounded, in steps."""
    mtbf_h = seen.gpu_hours_each() / max(gpus, 1)
    ideal_s = math.sqrt(2.0 * save_s * mtbf_h * 3600.0)
    interval_s = min(max(ideal_s, MIN_INTERVAL_S), MAX_INTERVAL_S)
    steps = _steps(interval_s, step_s, total_steps)
    reason = (
        f"every {steps} steps: a save takes {_amount(save_s)} s, this cluster loses a "
        f"{gpus}-GPU job every {_hours(mtbf_h)}{_prior_words(seen)}"
        f"{_bound_words(ideal_s, interval_s)}"
    )
    return Cadence(steps, reason)


def worth_changing(current: int | None, new: Cadence) -> bool:
    """Whether to move from the ``current`` interval to ``new`` (a set one always)."""
    if current is None or not new.automatic:
        return current != new.steps
    return abs(new.steps - current) > SETTLED_SHARE * current


def _steps(interval_s: float, step_s: float, total_steps: int | None) -> int:
    steps = max(1, round(interval_s / step_s))
    return min(steps, total_steps) if total_steps else steps


def _amount(value: float) -> str:
    """Two significant figures below 10 (0.31, 2.5), whole numbers above (41, 25,000)."""
    return f"{value:.2g}" if value < 10 else f"{value:,.0f}"


def _hours(hours: float) -> str:
    return f"{_amount(hours)} h"


def _prior_words(seen: Interruptions) -> str:
    if seen.count:
        return ""
    return (
        f" (none seen in {_amount(seen.gpu_hours)} GPU-hours: assumed one per "
        f"{PRIOR_GPU_HOURS_PER_INTERRUPTION:,.0f} GPU-hours)"
    )


def _bound_words(ideal_s: float, interval_s: float) -> str:
    if interval_s == ideal_s:
        return ""
    which = "at least" if interval_s > ideal_s else "at most"
    return f"; {which} {interval_s / 60:.0f} min between saves ({ideal_s / 60:.1f} min by Young)"
