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
from workers.backends.kubernetes_events import failed_create, quantity, quota_never_fits
from workers.backends.kubernetes_status import active_status, newest_by_index

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
    status = failed_create([event(QUOTA.format(used=8, limit=16))])

    assert status is not None
    assert (status.state, status.native_state) == (BackendState.PENDING, "FailedCreate")
    assert "waiting for quota" in status.reason and "exceeded quota: team-ml" in status.reason


def test_a_pod_larger_than_the_whole_quota_fails_as_a_launch_error() -> None:
    status = failed_create([event(QUOTA.format(used=0, limit=4))])

    assert status is not None and status.state == BackendState.FAILED
    assert status.failure_class() == FailureClass.LAUNCH_ERROR


def test_a_namespace_without_its_service_account_yet_is_waited_for() -> None:
    message = (
        'Error creating: pods "zp-a1-0-abcde" is forbidden: error looking up service account '
        't-1/default: serviceaccount "default" not found'
    )
    status = failed_create([event(message)])

    assert status is not None and status.state == BackendState.PENDING


def test_no_failed_create_event_says_nothing() -> None:
    assert failed_create([{"reason": "SuccessfulCreate", "message": "Created pod: x"}]) is None


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
    assert not quota_never_fits(message)
