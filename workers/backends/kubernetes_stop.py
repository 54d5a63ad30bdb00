"""The graceful stop of a Kubernetes attempt: its pods deleted with the stop's grace, the Job kept.

Deleting the Job first would hand the pods to the garbage collector, which deletes them with
their own ``terminationGracePeriodSeconds`` (the grace chosen at launch, which a later stop may
lengthen) and the Job would read as cancelled before any rank had saved. So ``cancel`` deletes
the running pods itself with ``gracePeriodSeconds`` (their kubelet sends SIGTERM now, SIGKILL
once the grace has passed) and marks the Job with when and with what grace; the Job controller
creates no replacement for a pod before it has failed (``podReplacementPolicy: Failed``, the
default with a ``podFailurePolicy``) and fails the Job at the first (``backoffLimit: 0``).
``poll`` says "stopping" until the Job has ended, then how the pods ended (exit 75: saved and
stopped), and deletes the Job. Pure: the caller makes the calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from workers.backends.base import BackendState, BackendStatus
from workers.backends.kubernetes_gang import format_time, parse_time

Json = dict[str, Any]
STOP_ANNOTATION = "zeropilot.dev/stop-requested-at"
GRACE_ANNOTATION = "zeropilot.dev/stop-grace-s"
# The kubelet's report and the Job controller's reaction after the grace, on a busy cluster:
# past this the Job is deleted whatever its pods say.
STOP_SLACK_S = 60.0
ENDED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class Stop:
    requested_at: datetime
    grace_s: int


def stop_annotation(grace_s: float, now: datetime | None = None) -> dict[str, str]:
    moment = now or datetime.now(UTC)
    return {STOP_ANNOTATION: format_time(moment), GRACE_ANNOTATION: str(math.ceil(grace_s))}


def stop_requested(job: Json) -> Stop | None:
    """The stop zeropilot asked of this Job, if it did."""
    annotations = job["metadata"].get("annotations") or {}
    requested_at = parse_time(str(annotations.get(STOP_ANNOTATION) or ""))
    grace = str(annotations.get(GRACE_ANNOTATION) or "")
    if requested_at is None or not grace.isdigit():
        return None
    return Stop(requested_at, int(grace))


def stop_is_overdue(stop: Stop, now: datetime | None = None) -> bool:
    deadline = stop.requested_at + timedelta(seconds=stop.grace_s + STOP_SLACK_S)
    return (now or datetime.now(UTC)) > deadline


def pod_ended(pod: Json) -> bool:
    return (pod.get("status") or {}).get("phase") in ENDED_PHASES


def pod_running(pod: Json) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def needs_stopping(pod: Json, grace_s: float) -> bool:
    """Whether the pod must still be deleted with the grace: not ended, and not already being
    deleted with that grace or a shorter one (the API server only ever shortens it)."""
    if pod_ended(pod):
        return False
    metadata = pod["metadata"]
    current = metadata.get("deletionGracePeriodSeconds")
    return not metadata.get("deletionTimestamp") or current is None or current > math.ceil(grace_s)


def stopping_status(stop: Stop) -> BackendStatus:
    """Still running: the training has had SIGTERM and saves within its grace."""
    reason = (
        f"stopping: SIGTERM sent at {format_time(stop.requested_at)}, the training has "
        f"{stop.grace_s} s to save before SIGKILL"
    )
    return BackendStatus(BackendState.RUNNING, native_state="Stopping", reason=reason)


def stopped_status(ended: BackendStatus, stop: Stop) -> BackendStatus:
    """How the stopped Job ended: a run that finished first is SUCCEEDED; else CANCELLED with
    each node's exit code (75: saved, then stopped; 137: killed after the grace)."""
    if ended.state == BackendState.SUCCEEDED:
        return ended
    reason = f"stopped by zeropilot with a {stop.grace_s} s grace: {ended.reason}"
    return BackendStatus(
        BackendState.CANCELLED,
        exit_code=ended.exit_code,
        native_state="CANCELLED",  # as a Job deleted before it ended
        reason=reason,
        log_tail=ended.log_tail,
        node_exit_codes=ended.node_exit_codes,
    )
