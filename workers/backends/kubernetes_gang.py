"""Gang semantics without a gang scheduler: a Job that holds GPUs while a pod waits is suspended.

The default scheduler places a multi-node Job's pods one by one, and the Job controller creates
them one by one: when only some fit, those hold their GPUs while the rest wait, and two such
Jobs can hold each other's GPUs for ever. Two waits count. A pod the scheduler cannot place
(``Unschedulable``) while others are bound to nodes; and a pod the namespace's ResourceQuota
refuses (the Job controller's ``FailedCreate`` event) while others exist, since a pod counts
against the quota from its creation on, placed or not. Without a Kueue queue on the profile
(Kueue admits a Job whole, or not at all), zeropilot bounds either wait: once it has lasted
``gang_timeout_s``, the Job is suspended (the Job controller deletes its pods, their GPUs and
quota go back) and unsuspended again between ``gang_timeout_s`` and twice that later, at
random, when every pod is created and placed once more. Two Jobs suspended together so come
back one after the other, and the first takes the room whole. The time to retry and why are
kept on the Job itself, as annotations. Pure: the caller patches the Job.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from workers.backends.base import BackendState, BackendStatus
from workers.backends.kubernetes_events import (
    FAILED_CREATE,
    QuotaRefusal,
    held_of_quota,
    quota_refusal,
)
from workers.backends.kubernetes_status import created_at

Json = dict[str, Any]
RETRY_ANNOTATION = "zeropilot.dev/gang-retry-at"
BECAUSE_ANNOTATION = "zeropilot.dev/gang-suspended-because"
_ENDED = frozenset({"Succeeded", "Failed"})  # a pod in these phases no longer counts for quota


@dataclass(frozen=True)
class Hold:
    """Some of a Job's pods hold GPUs (nodes, quota) while another waits for its own."""

    since: datetime
    held: str  # "1 of 2 pods held 8 GPUs of quota team-ml (...)"
    waiting: str  # "while the quota refused the pod of node 1"
    cause: str  # what keeps the other pod waiting: Unschedulable, FailedCreate

    def words(self, now: datetime) -> str:
        return f"{self.held} for {int((now - self.since).total_seconds())} s {self.waiting}"


@dataclass(frozen=True)
class _Refusals:
    """The quota refusals one event records: when the first and the latest came."""

    first: datetime
    last: datetime
    refusal: QuotaRefusal


def parse_time(text: str) -> datetime | None:
    """An RFC 3339 time in UTC as the API writes it: whole seconds, or a MicroTime's fraction."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def retry_at(job: Json) -> datetime | None:
    """When a Job that zeropilot suspended for its gang is to be tried again."""
    if not job["spec"].get("suspend"):
        return None
    return parse_time(_annotation(job, RETRY_ANNOTATION))


def retry_time(
    now: datetime, timeout_s: int, draw: Callable[[], float] = random.random
) -> datetime:
    """When a Job suspended ``now`` tries again: ``timeout_s`` later, plus up to as long again.
    Random, not an order: a Job knows no other, and two that collide draw anew the next time."""
    return now + timedelta(seconds=timeout_s * (1 + draw()))


def held_while_waiting(pods: dict[int, Json], nodes: int) -> Hold | None:
    """Since when some pods hold nodes while another is Unschedulable, in words; None when
    nothing is held or nothing waits."""
    bound = [p for p in pods.values() if (p.get("spec") or {}).get("nodeName")]
    waiting = [c for p in pods.values() if (c := _unschedulable(p)) is not None]
    if not bound or not waiting:
        return None
    first = min(waiting, key=lambda c: str(c.get("lastTransitionTime") or ""))
    since = parse_time(str(first.get("lastTransitionTime") or ""))
    if since is None:
        return None
    held = f"{len(bound)} of {nodes} pods held GPUs"
    waiting_for = f"while another could not be placed ({first.get('message') or ''})"
    return Hold(since, held, waiting_for, cause="Unschedulable")


def held_while_refused(pods: dict[int, Json], events: list[Json], nodes: int) -> Hold | None:
    """Since when some pods have held quota while the quota refused another of the Job's pods,
    in words; None when none holds any (the Job only waits for the quota) or no refusal came
    since they were created (one from before the last resume is stale)."""
    holding = [p for p in pods.values() if (p.get("status") or {}).get("phase") not in _ENDED]
    created = [t for p in holding if (t := parse_time(created_at(p))) is not None]
    if not created:
        return None
    held_since = min(created)
    refusals = [r for r in _quota_refusals(events) if r.last >= held_since]
    missing = [str(i) for i in range(nodes) if i not in pods]
    if not refusals or not missing:
        return None
    # An event may also count refusals from before these pods: the hold began with them.
    since = max(held_since, min(r.first for r in refusals))
    newest = max(refusals, key=lambda r: r.last).refusal
    held = f"{len(holding)} of {nodes} pods held {held_of_quota(newest, len(holding))}"
    refused = (
        f"the pod of node {missing[0]}"
        if len(missing) == 1
        else f"the pods of nodes {', '.join(missing)}"
    )
    return Hold(since, held, f"while the quota refused {refused}", cause=FAILED_CREATE)


def suspension(hold: Hold, now: datetime, retry: datetime) -> Json:
    """The patch that suspends the Job, with when to try again and why."""
    annotations = {RETRY_ANNOTATION: _precise(retry), BECAUSE_ANNOTATION: hold.words(now)}
    return {"spec": {"suspend": True}, "metadata": {"annotations": annotations}}


def resumption() -> Json:
    annotations = {RETRY_ANNOTATION: None, BECAUSE_ANNOTATION: None}
    return {"spec": {"suspend": False}, "metadata": {"annotations": annotations}}


def suspending_status(hold: Hold, now: datetime, retry: datetime) -> BackendStatus:
    """What the attempt shows the moment zeropilot suspends its Job."""
    reason = (
        f"{hold.words(now)}; zeropilot suspended the Job to free them and tries again at "
        f"{_when(retry, now)}"
    )
    return BackendStatus(BackendState.PENDING, native_state="GangTimeout", reason=reason)


def suspended_status(job: Json, now: datetime, due: datetime, timeout_s: int) -> BackendStatus:
    """What the attempt shows while its Job stays suspended until ``due``."""
    nodes = int(job["spec"].get("completions") or 1)
    # A Job suspended before the reason was kept on it was suspended for the scheduler.
    because = (
        _annotation(job, BECAUSE_ANNOTATION)
        or f"not all {nodes} pods could be placed within {timeout_s} s"
    )
    reason = (
        f"suspended: {because}; the Job holds nothing now, zeropilot tries again at "
        f"{_when(due, now)}"
    )
    return BackendStatus(BackendState.PENDING, native_state="GangTimeout", reason=reason)


def _when(moment: datetime, now: datetime) -> str:
    return f"{format_time(moment)} (in {max(0, math.ceil((moment - now).total_seconds()))} s)"


def _precise(moment: datetime) -> str:
    """To the millisecond: Jobs whose draws differ by less than a second come back apart."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _annotation(job: Json, key: str) -> str:
    return str((job["metadata"].get("annotations") or {}).get(key) or "")


def _quota_refusals(events: list[Json]) -> list[_Refusals]:
    """The Job controller's FailedCreate events in which a quota refused a pod, with when."""
    found = []
    for event in events:
        refusal = quota_refusal(str(event.get("message") or ""))
        if refusal is None or event.get("reason") != FAILED_CREATE:
            continue
        # A legacy event says first/lastTimestamp; an events.k8s.io one eventTime and a series.
        series = event.get("series") or {}
        first = event.get("firstTimestamp") or event.get("eventTime")
        last = event.get("lastTimestamp") or series.get("lastObservedTime") or first
        began, latest = parse_time(str(first or "")), parse_time(str(last or ""))
        if began is not None and latest is not None:
            found.append(_Refusals(began, latest, refusal))
    return found


def _unschedulable(pod: Json) -> Json | None:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next(
        (
            c
            for c in conditions
            if c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
        ),
        None,
    )
