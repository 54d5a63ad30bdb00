"""Where a job's GPU time went: the work it kept, and what it lost, by cause.

An attempt holds its GPUs from the moment its processes run until its end (waiting to be placed
holds none). That span is cut into segments, each with one cause, from the rows the attempt
left: its first and last reported steps, the steps its checkpoints saved, and how each save was
timed. The work an attempt kept runs up to the checkpoint the next attempt resumed from (or, for
the last attempt, up to its final step); docs/goodput.md defines every cause.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from service.core.failures import FailureClass


class Cause(StrEnum):
    PRODUCTIVE = "productive"  # steps whose result was kept (resumed from, or the final result)
    STARTUP = "startup"  # from the processes' start to the first step's start
    CHECKPOINTING = "checkpointing"  # saves made on the way (the cadence's price)
    REDONE = "redone"  # steps past the kept checkpoint: redone after a failure, or lost
    HANG = "hang"  # from the last progress of an attempt classed HANG to its stop
    STOP_SAVE = "stop_save"  # saving at a stop (preemption, drain, cancel) and exiting
    ENDING = "ending"  # from the last progress to the recorded end: a crash's teardown, an exit


LOST_CAUSES = tuple(cause for cause in Cause if cause != Cause.PRODUCTIVE)
HANG_CLASS = FailureClass.HANG  # an attempt zeropilot stopped as hung (service.core.progress)


@dataclass(frozen=True)
class Step:
    """A step an attempt reported: when the report came, and the step's own duration."""

    step: int
    at: datetime
    seconds: float = 0.0  # from its tokens/s; 0 where it reported none


@dataclass(frozen=True)
class Save:
    """A checkpoint an attempt reported once written: its step, when, and the save's time."""

    step: int
    path: str
    at: datetime
    seconds: float = 0.0


@dataclass(frozen=True)
class AttemptRun:
    number: int
    gpus: int
    start: datetime | None  # its processes running; None: they never ran
    end: datetime  # its recorded end, or now while it runs
    finished_ok: bool  # succeeded, or still running: its last step counts as kept
    stopped: bool  # saved at a stop and exited (its last save is the stop's)
    hung: bool  # classed HANG
    resumed_from: str | None
    first: Step | None
    last: Step | None
    at_saves: Mapping[int, Step] = field(default_factory=dict)  # its steps that were saved
    saves: Sequence[Save] = ()  # oldest first
    running: bool = False  # not ended: counted up to its latest report (what it did is known)


@dataclass(frozen=True)
class Segment:
    attempt: int
    cause: Cause
    start: datetime
    end: datetime
    gpus: int

    @property
    def gpu_seconds(self) -> float:
        return (self.end - self.start).total_seconds() * self.gpus


@dataclass(frozen=True)
class Tally:
    """GPU-seconds held, and how many went to each cause."""

    by_cause: Mapping[Cause, float]

    @property
    def held(self) -> float:
        return sum(self.by_cause.values())

    @property
    def productive(self) -> float:
        return self.by_cause.get(Cause.PRODUCTIVE, 0.0)

    @property
    def goodput(self) -> float | None:
        """The productive share of the GPU time held; None before any was held."""
        return self.productive / self.held if self.held > 0 else None


def kept_steps(attempts: Sequence[AttemptRun]) -> dict[int, int]:
    """Per attempt number, the last step whose work the job kept (absent: none kept).

    The last attempt keeps its last step if it succeeded or runs, else its latest save. The
    checkpoint it resumed from marks the step its maker kept, and so on back.
    """
    if not attempts:
        return {}
    saves = {save.path: (run.number, save.step) for run in attempts for save in run.saves}
    last = attempts[-1]
    kept: dict[int, int] = {}
    if (own := _own_kept(last)) is not None:
        kept[last.number] = own
    by_number = {run.number: run for run in attempts}
    source, seen = last.resumed_from, {last.number}
    while source in saves:
        number, step = saves[source]
        if number in seen:  # a chain that loops is a broken record, not a resume
            break
        kept[number], seen = step, seen | {number}
        source = by_number[number].resumed_from
    return kept


def _own_kept(run: AttemptRun) -> int | None:
    if run.finished_ok:
        steps = [run.last.step] if run.last else []
        return max([*steps, *(save.step for save in run.saves)], default=None)
    return max((save.step for save in run.saves), default=None)


def segments(run: AttemptRun, kept: int | None) -> list[Segment]:
    """The attempt's span from start to end, cut into consecutive segments by cause."""
    if run.start is None or run.end <= run.start:
        return []
    cut = _Cutter(run)
    if run.first is None:  # it never stepped
        cut.to(Cause.HANG if run.hung else Cause.STARTUP, run.end)
        return cut.done
    cut.to(Cause.STARTUP, run.first.at - timedelta(seconds=run.first.seconds))
    kept_save = next((s for s in run.saves if s.step == kept), None)
    if kept is not None:
        for save in run.saves:
            if save.step < kept:
                cut.to(Cause.PRODUCTIVE, save.at - timedelta(seconds=save.seconds))
                cut.to(Cause.CHECKPOINTING, save.at)
        cut.to(Cause.PRODUCTIVE, _step_done(run, kept, kept_save))
        if kept_save is not None:
            cut.to(Cause.STOP_SAVE if run.stopped else Cause.CHECKPOINTING, kept_save.at)
    cut.to(Cause.REDONE, _last_progress(run))
    if not run.running:
        cut.to(_tail_cause(run), run.end)
    return cut.done


def _step_done(run: AttemptRun, step: int, save: Save | None) -> datetime:
    """When ``step`` was done: its report, else its save's start, else the last report."""
    if (reported := run.at_saves.get(step)) is not None:
        return reported.at
    if run.last is not None and run.last.step == step:
        return run.last.at
    if save is not None:
        return save.at - timedelta(seconds=save.seconds)
    return run.last.at if run.last is not None else run.end


def _last_progress(run: AttemptRun) -> datetime:
    times = [save.at for save in run.saves] + ([run.last.at] if run.last else [])
    return max(times, default=run.end)


def _tail_cause(run: AttemptRun) -> Cause:
    if run.hung:
        return Cause.HANG
    return Cause.STOP_SAVE if run.stopped else Cause.ENDING


class _Cutter:
    """Appends segments end to end from the attempt's start: each ends at the time given,
    held inside [the previous end, the attempt's end], so they never overlap or leave gaps."""

    def __init__(self, run: AttemptRun) -> None:
        assert run.start is not None
        self.run, self.cursor = run, run.start
        self.done: list[Segment] = []

    def to(self, cause: Cause, until: datetime) -> None:
        until = min(max(until, self.cursor), self.run.end)
        if until > self.cursor:
            run = self.run
            self.done.append(Segment(run.number, cause, self.cursor, until, run.gpus))
        self.cursor = until


def job_segments(attempts: Sequence[AttemptRun]) -> list[Segment]:
    kept = kept_steps(attempts)
    return [piece for run in attempts for piece in segments(run, kept.get(run.number))]


def tally(
    pieces: Iterable[Segment], since: datetime | None = None, until: datetime | None = None
) -> Tally:
    """GPU-seconds by cause of the segments' parts inside [since, until] (None: unbounded)."""
    by_cause = dict.fromkeys(Cause, 0.0)
    for piece in pieces:
        start = max(piece.start, since) if since else piece.start
        end = min(piece.end, until) if until else piece.end
        if end > start:
            by_cause[piece.cause] += (end - start).total_seconds() * piece.gpus
    return Tally(by_cause)
