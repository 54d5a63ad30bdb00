"""Gang semantics without a gang scheduler: a Job that holds GPUs while a pod waits is suspended.

The default scheduler places a multi-node Job's pods one by one: when only some fit, those hold
their GPUs while the rest wait, and two such Jobs can hold each other's GPUs for ever. Without a
Kueue queue on the profile (Kueue admits a Job whole, or not at all), zeropilot bounds that
wait: once some pods are bound and another has been Unschedulable for ``gang_timeout_s``, the
Job is suspended (the Job controller deletes its pods, their GPUs go back) and unsuspended again
``gang_timeout_s`` later, when the scheduler tries to place every pod once more. The time to
retry is kept on the Job itself, as an annotation. Pure: the caller patches the Job.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

Json = dict[str, Any]
RETRY_ANNOTATION = "zeropilot.dev/gang-retry-at"


def parse_time(text: str) -> datetime | None:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def retry_at(job: Json) -> datetime | None:
    """When a Job that zeropilot suspended for its gang is to be tried again."""
    if not job["spec"].get("suspend"):
        return None
    annotations = job["metadata"].get("annotations") or {}
    return parse_time(str(annotations.get(RETRY_ANNOTATION) or ""))


def held_while_waiting(pods: dict[int, Json]) -> tuple[datetime, int, str] | None:
    """Since when some pods hold nodes while another is Unschedulable, how many hold, and the
    scheduler's words for the one that waits; None when nothing is held or nothing waits."""
    bound = [p for p in pods.values() if (p.get("spec") or {}).get("nodeName")]
    waiting = [c for p in pods.values() if (c := _unschedulable(p)) is not None]
    if not bound or not waiting:
        return None
    first = min(waiting, key=lambda c: str(c.get("lastTransitionTime") or ""))
    since = parse_time(str(first.get("lastTransitionTime") or ""))
    return (since, len(bound), str(first.get("message") or "")) if since else None


def suspension(timeout_s: int, now: datetime) -> Json:
    """The patch that suspends the Job and says when to try again."""
    retry = format_time(now + timedelta(seconds=timeout_s))
    return {"spec": {"suspend": True}, "metadata": {"annotations": {RETRY_ANNOTATION: retry}}}


def resumption() -> Json:
    return {"spec": {"suspend": False}, "metadata": {"annotations": {RETRY_ANNOTATION: None}}}


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
