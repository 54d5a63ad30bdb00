"""Reading a Kubernetes Job and its pods (plain API JSON) into a backend status; no API calls.

Pods are keyed by completion index (the node rank). A failed Job is explained by its most
specific cause: the deadline, a disrupted pod (preemption, eviction, node loss), an OOM-killed
container, the pod the Job controller names, or the pod that failed first.
"""

from __future__ import annotations

import re
from typing import Any

from service.core.clusters import ClusterProfile
from workers.backends.base import BackendState, BackendStatus
from workers.backends.kubernetes_render import CONTAINER

Json = dict[str, Any]

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"  # the Job controller's, on its pods
# Container waiting reasons that no wait will cure: the image or the container config is wrong.
LAUNCH_ERRORS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
POD_IN_MESSAGE = re.compile(r"\b[Pp]od [a-z0-9-]+/([a-z0-9.-]+)")
# The Job controller's words when its DisruptionTarget rule fired; the pod itself is gone by then.
DISRUPTION_IN_MESSAGE = re.compile(
    r"\b[Pp]od [a-z0-9-]+/(?P<pod>[a-z0-9.-]+) has condition DisruptionTarget"
)
SIGTERM_EXIT = 143  # how a rank ends when the Job controller stops the pods after a failure
STARTED = frozenset({"Running", "Succeeded", "Failed"})
ENDINGS = frozenset({"Complete", "SuccessCriteriaMet", "Failed", "FailureTarget"})


def newest_by_index(pods: list[Json]) -> dict[int, Json]:
    """The newest pod per completion index."""
    by_index: dict[int, Json] = {}
    for pod in pods:
        index = completion_index(pod)
        if index is None:
            continue
        known = by_index.get(index)
        if known is None or created_at(pod) >= created_at(known):
            by_index[index] = pod
    return by_index


def still_tracked(pods: list[Json]) -> list[Json]:
    """The pods the Job controller still counts. Those it stops because the Job was suspended
    lose its tracking finalizer before it deletes them, and linger (Failed, their exit code in
    place) until their kubelet confirms the delete, maybe after the Job was resumed."""
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        or TRACKING_FINALIZER in (p["metadata"].get("finalizers") or [])
    ]


def deleted_before_ending(job: Json) -> bool:
    """Whether the Job is being deleted and had not ended when that began: the conditions the
    Job controller adds while the garbage collector stops its pods come from the deletion."""
    deleted = str(job["metadata"].get("deletionTimestamp") or "")
    if not deleted:
        return False
    ended = [c for kind, c in true_conditions(job).items() if kind in ENDINGS]
    return not any(str(c.get("lastTransitionTime") or "") < deleted for c in ended)


def completion_index(pod: Json) -> int | None:
    metadata = pod.get("metadata") or {}
    text = (metadata.get("annotations") or {}).get(INDEX_ANNOTATION) or (
        metadata.get("labels") or {}
    ).get(INDEX_ANNOTATION)
    return int(text) if text is not None and str(text).isdigit() else None


def created_at(pod: Json) -> str:
    return str(pod["metadata"].get("creationTimestamp") or "")  # RFC 3339 in UTC: sortable


def true_conditions(obj: Json) -> dict[str, Json]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in conditions if c.get("status") == "True"}


def trainer_status(pod: Json) -> Json:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == CONTAINER), {})


def terminated_state(pod: Json) -> Json | None:
    terminated: Json | None = (trainer_status(pod).get("state") or {}).get("terminated")
    return terminated


def waiting_state(pod: Json) -> Json | None:
    waiting: Json | None = (trainer_status(pod).get("state") or {}).get("waiting")
    return waiting


def node_exit_codes(pods: dict[int, Json]) -> dict[int, int]:
    codes = {}
    for index, pod in pods.items():
        terminated = terminated_state(pod)
        if terminated is not None and terminated.get("exitCode") is not None:
            codes[index] = int(terminated["exitCode"])
    return codes


def pod_with_condition(pods: dict[int, Json], condition: str) -> Json | None:
    return next((pods[i] for i in sorted(pods) if condition in true_conditions(pods[i])), None)


def oom_killed_pod(pods: dict[int, Json]) -> Json | None:
    return next(
        (
            pods[i]
            for i in sorted(pods)
            if (terminated_state(pods[i]) or {}).get("reason") == "OOMKilled"
        ),
        None,
    )


def named_pod(pods: dict[int, Json], message: str) -> Json | None:
    """The pod a podFailurePolicy message names ("Container trainer for pod ns/name ...")."""
    named = {match[1] for match in POD_IN_MESSAGE.finditer(message)}
    return next((p for p in pods.values() if p["metadata"]["name"] in named), None)


def failing_pod(pods: dict[int, Json]) -> Json | None:
    """The pod that most likely failed first: a failed one not merely stopped (SIGTERM) after
    the others, the earliest to finish (whole seconds: ties are common), the lowest index."""
    failing = []
    for index, pod in pods.items():
        terminated = terminated_state(pod) or {}
        code = terminated.get("exitCode", 0)
        if code != 0 or (pod.get("status") or {}).get("phase") == "Failed":
            stopped = code == SIGTERM_EXIT
            failing.append((stopped, str(terminated.get("finishedAt") or "~"), index, pod))
    return min(failing, key=lambda item: item[:3])[3] if failing else None


def pod_reason(pod: Json | None) -> str:
    return str(((pod or {}).get("status") or {}).get("reason") or "")  # e.g. Evicted


def launch_error(pods: dict[int, Json]) -> BackendStatus | None:
    for index in sorted(pods):
        waiting = waiting_state(pods[index])
        if waiting is not None and waiting.get("reason") in LAUNCH_ERRORS:
            name = pods[index]["metadata"]["name"]
            reason = (
                f"pod {name} (node {index}) cannot start: {waiting['reason']}: "
                f"{waiting.get('message', '')}; zeropilot deleted the Job"
            )
            return BackendStatus(BackendState.FAILED, native_state=waiting["reason"], reason=reason)
    return None


def completions(job: Json) -> int:
    return int(job["spec"].get("completions") or 1)


def pods_missing(job: Json, pods: dict[int, Json]) -> bool:
    """Whether the Job controller should have created pods it has not (not while suspended)."""
    return not job["spec"].get("suspend") and len(pods) < completions(job)


def active_status(
    profile: ClusterProfile, job: Json, pods: dict[int, Json], every_pod: list[Json]
) -> BackendStatus:
    """RUNNING once every node's pod has run; else PENDING with what the first one waits for.
    A node whose pod ran counts as started while the Job controller reacts to its end (or
    replaces it): the attempt does not drop back to PENDING."""
    nodes = completions(job)
    if job["spec"].get("suspend"):
        where = f"waiting in queue {profile.queue}" if profile.queue else "the Job is suspended"
        return BackendStatus(BackendState.PENDING, native_state="Suspended", reason=where)
    started = {
        index
        for pod in every_pod
        if (index := completion_index(pod)) is not None
        and (pod.get("status") or {}).get("phase") in STARTED
    }
    if len(started) >= nodes:
        return BackendStatus(BackendState.RUNNING, native_state="Running")
    waiting = [i for i in range(nodes) if i not in started]
    missing = next((i for i in waiting if i not in pods), None)
    if missing is not None:
        reason = f"node {missing}: the Job controller has not created its pod yet"
        return BackendStatus(BackendState.PENDING, native_state="Pending", reason=reason)
    # The scheduler's words say most: show an unplaced pod before one that is merely starting.
    reasons = [(pending_reason(pods[i]), pods[i]) for i in waiting]
    reasons.sort(key=lambda item: item[0][0] != "Unschedulable")
    (native_state, why), pod = reasons[0]
    reason = f"{len(started)} of {nodes} pods running; pod {pod['metadata']['name']}: {why}"
    return BackendStatus(BackendState.PENDING, native_state=native_state, reason=reason)


def pending_reason(pod: Json) -> tuple[str, str]:
    unscheduled = next(
        (
            c
            for c in (pod.get("status") or {}).get("conditions") or []
            if c.get("type") == "PodScheduled" and c.get("status") == "False"
        ),
        None,
    )
    if unscheduled is not None:
        reason = str(unscheduled.get("reason") or "Unschedulable")
        return reason, f"{reason}: {unscheduled.get('message', '')}".rstrip(": ")
    waiting = waiting_state(pod)
    if waiting is not None and waiting.get("reason"):
        reason = str(waiting["reason"])
        return reason, f"{reason}: {waiting.get('message', '')}".rstrip(": ")
    phase = str((pod.get("status") or {}).get("phase") or "Pending")
    return phase, phase


def disrupted_index(job_name: str, message: str, disrupted: Json | None) -> int | None:
    """The node whose pod was disrupted: that pod's index, or, the pod gone, the index in the
    name the Job's message gives it (the Job controller names pods ``<job>-<index>-<suffix>``)."""
    if disrupted is not None:
        return completion_index(disrupted)
    found = DISRUPTION_IN_MESSAGE.search(message)
    named = found and re.fullmatch(rf"{re.escape(job_name)}-(\d+)-[a-z0-9]+", found["pod"])
    return int(named[1]) if named else None


def failed_status(
    failed: Json, pods: dict[int, Json], exit_codes: dict[int, int], job: Json
) -> tuple[BackendStatus, Json | None]:
    """Why the Job failed, most specific first: its deadline, a disruption, an OOM kill; and the
    pod whose log tells more (the caller reads it)."""
    job_reason = str(failed.get("reason") or "Failed")
    words = [f"{job_reason}: {failed.get('message') or ''}".rstrip(": ")]
    disrupted = pod_with_condition(pods, "DisruptionTarget")
    # Once one rank is OOM-killed the others fail too (NCCL errors, the Job stopping them).
    culprit = (
        disrupted
        or oom_killed_pod(pods)
        or named_pod(pods, str(failed.get("message") or ""))
        or failing_pod(pods)
    )
    terminated = (terminated_state(culprit) if culprit is not None else None) or {}
    if job_reason == "DeadlineExceeded":
        native_state = job_reason
    elif disrupted is not None:
        native_state = "DisruptionTarget"
        condition = true_conditions(disrupted)["DisruptionTarget"]
        words.append(
            f"pod {disrupted['metadata']['name']} disrupted: "
            f"{condition.get('reason', '')}: {condition.get('message', '')}"
        )
    elif DISRUPTION_IN_MESSAGE.search(str(failed.get("message") or "")):
        native_state = "DisruptionTarget"  # preempted, evicted or its node lost; pod gone
    else:
        native_state = str(terminated.get("reason") or pod_reason(culprit) or job_reason)
    if culprit is not None and terminated:
        words.append(
            f"pod {culprit['metadata']['name']} (node {completion_index(culprit)}) exited "
            f"{terminated.get('exitCode')} ({terminated.get('reason', '')})"
        )
    cause = disrupted_index(job["metadata"]["name"], str(failed.get("message") or ""), disrupted)
    words += without_exit_code(completions(job), exit_codes, cause)
    exit_code = terminated.get("exitCode")
    status = BackendStatus(
        BackendState.FAILED,
        exit_code=int(exit_code) if exit_code is not None else None,
        native_state=native_state,
        reason="; ".join(words),
        node_exit_codes=exit_codes,
    )
    return status, culprit or pods.get(0)


def without_exit_code(nodes: int, exit_codes: dict[int, int], disrupted: int | None) -> list[str]:
    """The nodes whose pods are gone or never ended, the disrupted one named as such: after a
    failure the Job controller stops and deletes the other pods, their exit codes with them."""
    words = []
    if disrupted is not None and disrupted not in exit_codes:
        words.append(f"node {disrupted}: disrupted, no exit code")
    gone = [str(i) for i in range(nodes) if i not in exit_codes and i != disrupted]
    if gone:
        words.append(f"node {', '.join(gone)}: no exit code (stopped by the Job controller)")
    return words
