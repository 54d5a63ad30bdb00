"""Reading a Job, its pods and its events into a status, on objects as the real server wrote them.

The pod and event shapes here were copied from the test control plane (kube-apiserver and
kube-controller-manager v1.36.2), trimmed to the fields the backend reads.
"""

from __future__ import annotations

from typing import Any

import pytest

from service.core.clusters import BackendKind, ClusterProfile
from service.core.failures import FailureClass
from workers.backends.base import BackendState
from workers.backends.kubernetes_events import failed_create, quantity, quota_overflow
from workers.backends.kubernetes_status import (
    active_status,
    deleted_before_ending,
    failed_status,
    newest_by_index,
    still_tracked,
)

JOB = {"metadata": {"name": "zp-a1"}, "spec": {"completions": 2, "parallelism": 2}}
PROFILE = ClusterProfile(name="gpu-k8s", kind=BackendKind.KUBERNETES)
QUOTA = (
    'Error creating: pods "zp-a1-1-x7k2p" is forbidden: exceeded quota: team-ml, requested: '
    "requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu={used}, limited: "
    "requests.nvidia.com/gpu={limit}"
)


def pod(index: int, phase: str, created: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"zp-a1-{index}-{created[-2:]}",
            "creationTimestamp": created,
            "labels": {"batch.kubernetes.io/job-completion-index": str(index)},
        },
        "status": {"phase": phase},
    }


def event(message: str) -> dict[str, Any]:
    return {"reason": "FailedCreate", "message": message, "lastTimestamp": "2026-11-30T16:00:00Z"}


def test_a_failed_pod_being_replaced_does_not_drop_the_attempt_back_to_pending() -> None:
    every_pod = [
        pod(0, "Running", "2026-11-30T16:00:00Z"),
        pod(1, "Failed", "2026-11-30T16:00:00Z"),
        pod(1, "Pending", "2026-11-30T16:00:09Z"),  # its replacement, not scheduled yet
    ]

    status = active_status(PROFILE, JOB, newest_by_index(every_pod), every_pod)

    assert status.state == BackendState.RUNNING


def test_a_quota_that_other_jobs_fill_leaves_the_attempt_pending_with_its_words() -> None:
    status = failed_create([event(QUOTA.format(used=8, limit=16))], pods=2)

    assert status is not None
    assert (status.state, status.native_state) == (BackendState.PENDING, "FailedCreate")
    assert "waiting for quota" in status.reason and "exceeded quota: team-ml" in status.reason


def test_a_quota_that_holds_one_pod_but_not_the_whole_job_fails_with_its_numbers() -> None:
    # The "used 8" is this Job's own pod 0: waiting would never make room for pod 1.
    status = failed_create([event(QUOTA.format(used=8, limit=8))], pods=2)

    assert status is not None and status.state == BackendState.FAILED
    assert (
        "its 2 pods need 2 x requests.nvidia.com/gpu=8, more than the quota's hard limit "
        "requests.nvidia.com/gpu=8" in status.reason
    )
    assert status.failure_class() == FailureClass.LAUNCH_ERROR


def test_a_pod_larger_than_the_whole_quota_fails_as_a_launch_error() -> None:
    status = failed_create([event(QUOTA.format(used=0, limit=4))], pods=2)

    assert status is not None and status.state == BackendState.FAILED
    assert status.failure_class() == FailureClass.LAUNCH_ERROR


def test_a_namespace_without_its_service_account_yet_is_waited_for() -> None:
    message = (
        'Error creating: pods "zp-a1-0-abcde" is forbidden: error looking up service account '
        't-1/default: serviceaccount "default" not found'
    )
    status = failed_create([event(message)], pods=2)

    assert status is not None and status.state == BackendState.PENDING


def test_no_failed_create_event_says_nothing() -> None:
    assert failed_create([{"reason": "SuccessfulCreate", "message": "Created pod: x"}], 2) is None


@pytest.mark.parametrize(
    ("text", "value"),
    [("8", 8), ("512Gi", 512 * 2**30), ("500m", 0.5), ("1536Mi", 1536 * 2**20), ("2k", 2000)],
)
def test_quantities_read_as_kubernetes_writes_them(text: str, value: float) -> None:
    assert quantity(text) == pytest.approx(value)


def test_a_quota_on_memory_compares_quantities_not_strings() -> None:
    message = (
        "exceeded quota: mem, requested: requests.memory=512Gi, used: requests.memory=0, "
        "limited: requests.memory=1Ti"
    )
    assert quota_overflow(message, pods=2) is None  # 1024Gi in all: exactly the limit
    assert quota_overflow(message, pods=3) == (
        "its 3 pods need 3 x requests.memory=512Gi, more than the quota's hard limit "
        "requests.memory=1Ti"
    )


def stopped(index: int, created: str, tracked: bool) -> dict[str, Any]:
    """A pod being deleted, Failed with exit 143, with or without the controller's finalizer."""
    lingering = pod(index, "Failed", created)
    lingering["metadata"]["deletionTimestamp"] = "2026-11-30T16:00:05Z"
    lingering["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"] if tracked else []
    lingering["status"]["containerStatuses"] = [
        {"name": "trainer", "state": {"terminated": {"exitCode": 143, "reason": "Error"}}}
    ]
    return lingering


def test_pods_a_suspension_stopped_do_not_count_as_running_after_the_job_resumes() -> None:
    every_pod = [
        stopped(0, "2026-11-30T16:00:00Z", tracked=False),  # let go of by the Job controller
        stopped(1, "2026-11-30T16:00:00Z", tracked=False),
        pod(0, "Pending", "2026-11-30T16:00:09Z"),  # the resumed Job's new pods
        pod(1, "Pending", "2026-11-30T16:00:09Z"),
    ]

    live = still_tracked(every_pod)
    status = active_status(PROFILE, JOB, newest_by_index(live), live)

    assert len(live) == 2
    assert (status.state, status.reason) == (
        BackendState.PENDING,
        f"0 of 2 pods running; pod {live[0]['metadata']['name']}: Pending",
    )


def test_a_pod_being_deleted_that_the_controller_still_counts_is_kept() -> None:
    evicted = stopped(1, "2026-11-30T16:00:00Z", tracked=True)  # not yet counted as failed

    assert still_tracked([evicted]) == [evicted]


def job_with(conditions: list[dict[str, str]], deleted: str | None) -> dict[str, Any]:
    metadata = {"name": "zp-a1", "namespace": "t-1", "deletionTimestamp": deleted}
    return {"metadata": metadata, "spec": JOB["spec"], "status": {"conditions": conditions}}


def test_a_job_failing_only_while_it_is_deleted_reads_as_being_deleted() -> None:
    # The garbage collector stops the pods of a cancelled Job; the controller then fails it.
    failing = {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
               "lastTransitionTime": "2026-11-30T16:00:07Z"}  # fmt: skip
    ended_first = {**failing, "lastTransitionTime": "2026-11-30T16:00:01Z"}

    assert deleted_before_ending(job_with([failing], deleted="2026-11-30T16:00:05Z"))
    assert not deleted_before_ending(job_with([ended_first], deleted="2026-11-30T16:00:05Z"))
    assert not deleted_before_ending(job_with([failing], deleted=None))


def test_a_disruption_names_the_disrupted_node_apart_from_the_stopped_ones() -> None:
    failed = {
        "type": "FailureTarget", "status": "True", "reason": "PodFailurePolicy",
        "message": "Pod t-1/zp-a1-1-q8x2z has condition DisruptionTarget matching FailJob rule "
        "at index 0",
    }  # fmt: skip

    status, _culprit = failed_status(failed, {}, {}, job_with([failed], deleted=None))

    assert "node 1: disrupted, no exit code" in status.reason
    assert "node 0: no exit code (stopped by the Job controller)" in status.reason
    assert status.native_state == "DisruptionTarget"
