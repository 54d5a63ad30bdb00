"""Placement: with ``resources.cluster: auto``, which cluster a job goes to, and why not the others.

The advisor plans the job for every eligible profile (each GPU type gets its own plan, so the
same job can be ZeRO-3 with checkpointing on one GPU and ZeRO-2 across eight); admission says
where it would start now. The job goes where it starts now, then where its plan is predicted to
train fastest (tokens per second of the whole job); ties keep the profiles' order. Each cluster
left out is named with the reason. Pure: the API gathers the admission state and applies it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from service.core.advisor.models import Advice, NoPlanFits
from service.core.clusters import BackendKind, ClusterProfile
from service.core.spec import JobSpec

AUTO = "auto"  # resources.cluster: let zeropilot choose
END_TIE = 0.05  # predicted ends this close are a tie (the time model is not closer than that)


@dataclass(frozen=True)
class Option:
    """One cluster considered for a job."""

    cluster: str
    advice: Advice | None = None  # None: ruled out
    ruled_out: str = ""  # why no plan runs there
    waits: str | None = ""  # why it would not start at once ("": it would; None: not known)
    start_in_s: float | None = None  # when it would start there (0: now; None: not known)
    duration_s: float | None = None  # the job's steps at the plan's predicted pace

    @property
    def end_in_s(self) -> float | None:
        """When the job would end there, where both its start and its length are known."""
        start = 0.0 if self.waits == "" else self.start_in_s
        if start is None or self.duration_s is None:
            return None
        return start + self.duration_s

    @property
    def tokens_per_second(self) -> float:
        plan = self.advice.plan if self.advice else None
        return plan.tokens_per_second or 0.0 if plan else 0.0


def candidates(spec: JobSpec, profiles: Sequence[ClusterProfile]) -> list[Option | ClusterProfile]:
    """The profiles the spec may run on (``resources.clusters`` limits them), and for each one
    it cannot run on an Option saying why."""
    allowed = set(spec.resources.clusters or ())
    chosen: list[Option | ClusterProfile] = []
    for profile in profiles:
        if allowed and profile.name not in allowed:
            continue
        if why := _cannot_run(spec, profile):
            chosen.append(Option(profile.name, ruled_out=why))
        else:
            chosen.append(profile)
    return chosen


def plan_everywhere(
    spec: JobSpec,
    profiles: Sequence[ClusterProfile],
    plan: Callable[[JobSpec, ClusterProfile], Advice],
    waits: Callable[[ClusterProfile], str | None],
    start_in: Callable[[ClusterProfile], float | None] = lambda _profile: None,
) -> list[Option]:
    """Every eligible cluster with its plan (or why none fits), why it would wait and, then,
    when it would start."""
    options = []
    for entry in candidates(spec, profiles):
        if isinstance(entry, Option):
            options.append(entry)
            continue
        placed = spec.model_copy(update={"resources": spec.resources.model_copy(
            update={"cluster": entry.name})})  # fmt: skip
        try:
            advice = plan(placed, entry)
        except NoPlanFits as exc:
            options.append(Option(entry.name, ruled_out=f"no plan fits: {exc}"))
            continue
        except ValueError as exc:  # e.g. zero.overrides that break the batch there
            options.append(Option(entry.name, ruled_out=str(exc)))
            continue
        why = waits(entry)
        start = start_in(entry) if why else None
        options.append(Option(entry.name, advice, "", why, start, _duration_s(spec, advice)))
    return options


def start_in_s(need: int, free: int, ends: Sequence[tuple[int, float | None]]) -> float | None:
    """Seconds until ``need`` GPUs are free, where ``free`` are free now and the running jobs
    hold the others (their GPUs, and when each is predicted to end): now, or the end of the
    job whose GPUs make it enough, taken in order of their ends. None when that needs a job
    whose end is not known, or more GPUs than the limit has."""
    if need <= free:
        return 0.0
    for gpus, end_s in sorted(ends, key=lambda end: (end[1] is None, end[1] or 0.0)):
        if end_s is None:
            return None
        free += gpus
        if free >= need:
            return end_s
    return None


def _duration_s(spec: JobSpec, advice: Advice) -> float | None:
    step_s = spec.training.step_seconds(advice.plan.tokens_per_second)
    if spec.training.steps is None or step_s is None:
        return None
    return spec.training.steps * step_s


def choose(options: Sequence[Option]) -> Option | None:
    """Where the job is predicted to end first (its length known, and its start there); else
    where it starts now, then where it trains fastest. None when no cluster can run it."""
    runnable = [o for o in options if o.advice is not None]
    if not runnable:
        return None

    ends = [end for o in runnable if (end := o.end_in_s) is not None]
    if ends:  # a cluster ending within END_TIE of the first is as good: no waiting for a hair
        last = min(ends) * (1 + END_TIE)
        runnable = [o for o in runnable if (end := o.end_in_s) is not None and end <= last]
    return min(runnable, key=lambda o: (bool(o.waits), -o.tokens_per_second))


def summary(options: Sequence[Option], chosen: Option) -> str:
    """The choice and the others in one paragraph, for the job's record."""
    parts = [f"placed on {chosen.cluster} ({_words(chosen)})"]
    for option in options:
        if option is not chosen:
            parts.append(f"{option.cluster}: {_words(option)}")
    return "; ".join(parts)


def _words(option: Option) -> str:
    if option.advice is None:
        return f"ruled out, {option.ruled_out}"
    pace = (
        f"{option.advice.plan.label()}, {option.tokens_per_second / 1000:.1f}k tokens/s predicted"
    )
    if option.waits is None:
        return pace
    start = f"waits: {option.waits}" if option.waits else "starts now"
    if option.waits and option.start_in_s is not None:
        start += f" (expected to start in {span(option.start_in_s)})"
    if (end := option.end_in_s) is not None:
        start += f", ends in {span(end)}"
    return f"{pace}, {start}"


def span(seconds: float) -> str:
    """A duration as a person reads it: 45 s, 12 min, 3.5 h, 2.1 days."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _cannot_run(spec: JobSpec, profile: ClusterProfile) -> str:
    if spec.resources.nodes > profile.max_nodes:
        return f"offers at most {profile.max_nodes} nodes, the job asks for {spec.resources.nodes}"
    if spec.resources.gpus_per_node > profile.gpus_per_node:
        return (
            f"has {profile.gpus_per_node} GPUs per node, the job asks for"
            f" {spec.resources.gpus_per_node}"
        )
    if profile.kind == BackendKind.KUBERNETES and spec.image is None:
        return "runs each node in a container and the job has no image"
    return ""


def movable(
    profiles: Sequence[ClusterProfile],
    failed: set[str],
    here: ClusterProfile | None,
    has_checkpoints: bool,
) -> tuple[list[ClusterProfile], list[Option]]:
    """Where a job whose launch failed for good on ``here`` may go instead: not a cluster where
    a launch of it failed, and, when it has checkpoints to resume from, only a cluster that
    mounts the same shared storage; the others with the reason."""
    kept: list[ClusterProfile] = []
    left_out: list[Option] = []
    storage = here.storage if here is not None else None
    for profile in profiles:
        if profile.name in failed:
            left_out.append(Option(profile.name, ruled_out="a launch of this job failed there"))
        elif has_checkpoints and (storage is None or profile.storage != storage):
            where = f"storage {storage}" if storage else "its own storage"
            left_out.append(Option(profile.name, ruled_out=(
                f"its checkpoints are on {where} of {here.name if here else '?'}, which this"
                " cluster does not mount"
            )))  # fmt: skip
        else:
            kept.append(profile)
    return kept, left_out
