"""Placement: with ``resources.cluster: auto``, which cluster a job goes to, and why not the others.

The advisor plans the job for every eligible profile (each GPU type gets its own plan, so the
same job can be ZeRO-3 with checkpointing on one GPU and ZeRO-2 across eight); admission says
where it would start now. The job goes where it starts now, then where its plan is predicted to
train fastest (tokens per second of the whole job); ties keep the profiles' order. Each cluster
left out is named with the reason. Pure: ``service.db.placing`` gathers the admission state
for every caller (a submit, a re-placement, advice) and they apply the choice.

With ``resources.placement: cost`` the job goes where it is predicted to cost least: its GPUs
times its predicted hours times the profile's ``usd_per_gpu_hour`` (without a length, the cost
of one step: the same order, as every cluster runs the same steps on the same GPU count). Costs
within COST_TIE of the least are a tie, which the time rule above breaks (the earlier end). A
cluster without a price is never taken over a priced one that can run the job: cost placement
picks among the unpriced clusters, by time, only when no priced cluster can run it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from math import floor, log10
from typing import Literal

from service.core.advisor.models import Advice, BadOverrides, NoPlanFits
from service.core.clusters import BackendKind, ClusterProfile
from service.core.spec import JobSpec

AUTO = "auto"  # resources.cluster: let zeropilot choose
END_TIE = 0.05  # predicted ends this close are a tie (the time model is not closer than that)
COST_TIE = 0.05  # so are costs: a cost is the same step time times a price
Placement = Literal["time", "cost"]  # resources.placement


@dataclass(frozen=True)
class Option:
    """One cluster considered for a job."""

    cluster: str
    advice: Advice | None = None  # None: ruled out
    ruled_out: str = ""  # why no plan runs there
    waits: str | None = ""  # why it would not start at once ("": it would; None: not known)
    start_in_s: float | None = None  # when it would start there (0: now; None: not known)
    duration_s: float | None = None  # the job's steps at the plan's predicted pace
    step_s: float | None = None  # one optimizer step at that pace
    usd_per_hour: float | None = None  # the job's GPUs at the profile's price (None: unpriced)

    @property
    def end_in_s(self) -> float | None:
        """When the job would end there, where both its start and its length are known."""
        start = 0.0 if self.waits == "" else self.start_in_s
        if start is None or self.duration_s is None:
            return None
        return start + self.duration_s

    @property
    def cost_usd(self) -> float | None:
        """What the whole job would cost there, where its length and the price are known."""
        if self.usd_per_hour is None or self.duration_s is None:
            return None
        return self.usd_per_hour * self.duration_s / 3600

    @property
    def usd_per_step(self) -> float | None:
        """What one step would cost there: cost placement's order, with or without a length."""
        if self.usd_per_hour is None or self.step_s is None:
            return None
        return self.usd_per_hour * self.step_s / 3600

    @property
    def tokens_per_second(self) -> float:
        plan = self.advice.plan if self.advice else None
        return plan.tokens_per_second or 0.0 if plan else 0.0


def listed(spec: JobSpec, profiles: Iterable[ClusterProfile]) -> list[ClusterProfile]:
    """The profiles the job may go to: every one, or those its ``resources.clusters`` names."""
    allowed = set(spec.resources.clusters or ())
    return [profile for profile in profiles if not allowed or profile.name in allowed]


def plan_everywhere(
    spec: JobSpec,
    profiles: Sequence[ClusterProfile],
    plan: Callable[[JobSpec, ClusterProfile], Advice],
    waits: Callable[[ClusterProfile], str | None],
    start_in: Callable[[ClusterProfile], float | None] = lambda _profile: None,
) -> list[Option]:
    """Every listed cluster with why it cannot run the job, or why it would wait there, when
    it would start and its plan: the pure pipeline (the service's, with admission's limits
    and a moving job's rules, is ``service.db.placing``)."""
    options = []
    for profile in listed(spec, profiles):
        if why := cannot_run(spec, profile):
            options.append(Option(profile.name, ruled_out=why))
            continue
        wait = waits(profile)
        options.append(planned(spec, profile, plan, wait, start_in(profile) if wait else None))
    return options


def planned(
    spec: JobSpec,
    profile: ClusterProfile,
    plan: Callable[[JobSpec, ClusterProfile], Advice],
    waits: str | None,
    start_in_s: float | None,
) -> Option:
    """The job planned for ``profile`` with its pace and price there, or ruled out where no
    plan fits (or its ``zero.overrides`` break the plan there)."""
    placed = spec.model_copy(update={"resources": spec.resources.model_copy(
        update={"cluster": profile.name})})  # fmt: skip
    try:
        advice = plan(placed, profile)
    except NoPlanFits as exc:
        return Option(profile.name, ruled_out=f"no plan fits: {exc}")
    except BadOverrides as exc:
        return Option(profile.name, ruled_out=str(exc))
    step_s = spec.training.step_seconds(advice.plan.tokens_per_second)
    duration_s = spec.training.steps * step_s if spec.training.steps and step_s else None
    price = profile.usd_per_gpu_hour
    usd_per_hour = price * spec.resources.world_size if price is not None else None
    return Option(profile.name, advice, "", waits, start_in_s, duration_s, step_s, usd_per_hour)


def choose(options: Sequence[Option], by: Placement = "time") -> Option | None:
    """Where the job is predicted to end first, or with ``by="cost"`` cost least (the module
    says how). None when no cluster can run it."""
    runnable = [o for o in options if o.advice is not None]
    if not runnable:
        return None
    priced = [(cost, o) for o in runnable if (cost := o.usd_per_step) is not None]
    if by == "cost" and priced:
        least = min(cost for cost, _ in priced)
        return _first_to_end([o for cost, o in priced if cost <= least * (1 + COST_TIE)])
    return _first_to_end(runnable)


def _first_to_end(runnable: Sequence[Option]) -> Option:
    """Where the job is predicted to end first (its length known, and its start there); else
    where it starts now, then where it trains fastest."""
    ends = [end for o in runnable if (end := o.end_in_s) is not None]
    if ends:  # a cluster ending within END_TIE of the first is as good: no waiting for a hair
        last = min(ends) * (1 + END_TIE)
        runnable = [o for o in runnable if (end := o.end_in_s) is not None and end <= last]
    return min(runnable, key=lambda o: (bool(o.waits), -o.tokens_per_second))


def summary(options: Sequence[Option], chosen: Option, by: Placement = "time") -> str:
    """The choice and the others in one paragraph, for the job's record."""
    how = " by cost" if by == "cost" and chosen.usd_per_step is not None else ""
    parts = [f"placed on {chosen.cluster}{how} ({_words(chosen)})"]
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
    if price := cost_words(option):
        pace += f", costs {price}"
    if option.waits is None:
        return pace
    start = f"waits: {option.waits}" if option.waits else "starts now"
    if option.waits and option.start_in_s is not None:
        start += f" (expected to start in {span(option.start_in_s)})"
    if (end := option.end_in_s) is not None:
        start += f", ends in {span(end)}"
    return f"{pace}, {start}"


def cost_words(option: Option) -> str:
    """The job's predicted cost there ("$412.30"), a step's without its length ("$0.0206 a
    step"), "" where the cluster has no price."""
    if (cost := option.cost_usd) is not None:
        return money(cost)
    if (per_step := option.usd_per_step) is not None:
        return f"{money(per_step)} a step"
    return ""


def money(usd: float) -> str:
    """Dollars to the cent, and a small amount to three significant digits ($0.0206)."""
    if usd == 0 or usd >= 1:
        return f"${usd:,.2f}"
    return f"${usd:.{max(2, 2 - floor(log10(usd)))}f}"


def why_not(option: Option, chosen: Option | None, by: Placement = "time") -> str:
    """A word for the table on why a cluster that can run the job was not chosen."""
    if option is chosen or option.advice is None:
        return "" if option is chosen else option.ruled_out
    if by == "cost" and chosen is not None and (least := chosen.usd_per_step) is not None:
        if (cost := option.usd_per_step) is None:
            return "not priced"
        if cost > least * (1 + COST_TIE):
            return "costs more"
    return "ends later" if option.duration_s is not None else "slower"


def span(seconds: float) -> str:
    """A duration as a person reads it: 45 s, 12 min, 3.5 h, 2.1 days."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def cannot_run(spec: JobSpec, profile: ClusterProfile) -> str:
    """Why the job cannot run on ``profile`` whatever its load ("": it can)."""
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
