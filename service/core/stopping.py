"""How long a stopped attempt may take to save before it is killed: the grace of a stop.

Every stop (a cancel, a preemption, a drain) sends the training processes SIGTERM, which
``zeropilot.runtime`` turns into "save at the end of this step", and SIGKILL only after the
grace. The grace must cover the step in progress and one save, so it comes from the job's own
measured saves where it has any, never from a guess about its size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_SAVE_SECONDS = 86_400.0  # a save reported as taking longer than a day is not a number
MAX_GRACE_S = 86_400
DEFAULT_GRACE_S = 30.0  # Kubernetes' own default terminationGracePeriodSeconds
SAVE_MARGIN = 2.0  # a save under a loaded filesystem can take twice the slowest one seen
STEP_ALLOWANCE_S = 10.0  # finishing the step in progress when SIGTERM arrives, and exiting


@dataclass(frozen=True)
class Grace:
    seconds: float
    why: str  # in words, for the stop's event


def stop_grace(
    configured: float | None, save_seconds: Sequence[float], default: float = DEFAULT_GRACE_S
) -> Grace:
    """The spec's ``checkpoint.grace_s``, else sized from the job's saves, else the default."""
    if configured is not None:
        return Grace(float(configured), f"{configured:g} s, the spec's checkpoint.grace_s")
    if not save_seconds:
        return Grace(default, f"{default:g} s, the default (no save of this job measured yet)")
    slowest = max(save_seconds)
    sized = SAVE_MARGIN * slowest + STEP_ALLOWANCE_S
    seconds = min(max(default, sized), float(MAX_GRACE_S))
    count = len(save_seconds)
    return Grace(
        round(seconds, 1),
        f"{seconds:.0f} s: {SAVE_MARGIN:g} x the slowest of its {count} saves ({slowest:.1f} s)"
        f" + {STEP_ALLOWANCE_S:g} s, at least {default:g} s",
    )
