"""Re-placing a ``cluster: auto`` job that waits for admission, when another cluster becomes
the better choice, without letting it bounce between clusters.

Admission state changes all the time (a job ends early, another is submitted), and every
prediction behind it is a model's. So a waiting job moves only when the other cluster's
predicted end (its start, without a length) is earlier by a clear margin, both relative and
absolute, and not within a settling time of its last placement. Pure: the reconcile pass
gathers the options (``service.core.placement``) and applies the move.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from service.core.placement import Option, choose, span


@dataclass(frozen=True)
class Hysteresis:
    """When a move is worth it.

    min_gain: 4x placement's tie band (END_TIE, 5%), so a move rests on a gain well outside
    the time model's error, not on noise in the running jobs' predicted ends.
    min_gain_s: a move gives up the job's place in its queue and re-plans it; ten minutes
    earlier is worth that, a few seconds is not (a short job's 20% is seconds).
    settle_s: a job just placed or moved stays at least this long, so one burst of changes
    moves it at most once."""

    min_gain: float = 0.20
    min_gain_s: float = 600.0
    settle_s: float = 900.0


def settled_since(now: datetime, rule: Hysteresis) -> datetime:
    """Jobs placed before this may move again."""
    return now - timedelta(seconds=rule.settle_s)


def move_to(here: Option, options: Sequence[Option], rule: Hysteresis) -> Option | None:
    """Where a waiting job should go instead of ``here`` (one of ``options``), or None to stay:
    the time rule's choice, when it ends (starts, without a length) earlier by the margins, or
    at once when it can no longer run ``here`` (a cap lowered under it: it would wait for ever
    and hold up the cluster's queue)."""
    best = choose(options)
    if best is None or best.cluster == here.cluster:
        return None
    if here.advice is None:
        return best
    stay, go = finish_s(here), finish_s(best)
    if go is None:
        return None
    if stay is None:  # when it would start here is not known: only a start now is clearly better
        return best if go == 0.0 else None
    gain = stay - go
    return best if gain >= rule.min_gain_s and gain >= rule.min_gain * stay else None


def finish_s(option: Option) -> float | None:
    """What moves compare: the predicted end, or without a length the predicted start."""
    if option.duration_s is not None:
        return option.end_in_s
    return 0.0 if option.waits == "" else option.start_in_s


def moved_words(here: Option, there: Option) -> str:
    """Why it moved, for the job's event."""
    if here.advice is None:
        return (
            f"re-placed on {there.cluster}: it can no longer run on {here.cluster}"
            f" ({here.ruled_out})"
        )
    what = "end" if there.duration_s is not None else "start"
    return (
        f"re-placed on {there.cluster}: expected to {what} {_when(there)} instead of"
        f" {_when(here)} on {here.cluster}"
    )


def _when(option: Option) -> str:
    seconds = finish_s(option)
    if seconds is None:
        return "at a time not known"
    return "now" if seconds == 0 else f"in {span(seconds)}"
