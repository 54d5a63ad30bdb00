"""The gang timeout's pure parts: since when a Job holds GPUs while another of its pods waits,
and when a suspended Job tries again.

Pod and event shapes were copied from the test control plane (kube-apiserver and
kube-controller-manager v1.36.2), trimmed to the fields read.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from workers.backends.base import BackendState
from workers.backends.kubernetes_events import held_of_quota, quota_refusal
from workers.backends.kubernetes_gang import (
    held_while_refused,
    held_while_waiting,
    parse_time,
    retry_at,
    retry_time,
    suspended_status,
    suspending_status,
    suspension,
)

QUOTA = (
    'Error creating: pods "zp-a1-1-z92s2" is forbidden: exceeded quota: team-ml, requested: '
    "requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=16, limited: "
    "requests.nvidia.com/gpu=16"
)
POLICY = (
    "Error creating: pods \"zp-a1-1-g78gl\" is forbidden: ValidatingAdmissionPolicy 'gate' with "
    "binding 'gate' denied request: held back"
)
HELD_8 = "1 of 2 pods held 8 GPUs of quota team-ml (limited: requests.nvidia.com/gpu=16)"


def at(clock: str) -> datetime:
    moment = parse_time(f"2026-12-04T{clock}Z")
    assert moment is not None
    return moment


def pod(index: int, created: str, phase: str = "Pending") -> dict[str, Any]:
    metadata = {"name": f"zp-a1-{index}-zsjzh", "creationTimestamp": f"2026-12-04T{created}Z"}
    return {"metadata": metadata, "status": {"phase": phase}}


def event(message: str, first: str, last: str | None = None, count: int = 1) -> dict[str, Any]:
    """A FailedCreate event as the Job controller's recorder writes it (core/v1)."""
    return {
        "reason": "FailedCreate",
        "message": message,
        "count": count,
        "firstTimestamp": f"2026-12-04T{first}Z",
        "lastTimestamp": f"2026-12-04T{last or first}Z",
        "eventTime": None,
    }


def test_pod_0_holding_quota_while_pod_1_is_refused_holds_since_the_first_refusal() -> None:
    events = [
        event(POLICY, "14:54:05"),  # another refusal, not the quota's: it does not count
        event(QUOTA, "14:54:12"),
        event(QUOTA, "14:54:13"),
    ]

    hold = held_while_refused({0: pod(0, "14:54:05")}, events, nodes=2)

    assert hold is not None and hold.since == at("14:54:12")
    assert hold.words(at("14:54:17.4")) == (
        f"{HELD_8} for 5 s while the quota refused the pod of node 1"
    )
    assert hold.cause == "FailedCreate"


def test_a_refusal_from_before_the_last_resume_does_not_count() -> None:
    # Resumed at 15:00:36: the Job controller made a new pod 0; the refusal is the last run's.
    events = [event(QUOTA, "15:00:20", "15:00:28", count=4)]

    assert held_while_refused({0: pod(0, "15:00:36")}, events, nodes=2) is None


def test_an_event_counting_refusals_from_before_a_resume_counts_from_the_new_pods() -> None:
    # The recorder folds repeats into one event: first from the last run, last from this one.
    events = [event(QUOTA, "15:00:20", "15:00:37", count=6)]

    hold = held_while_refused({0: pod(0, "15:00:36")}, events, nodes=2)

    assert hold is not None and hold.since == at("15:00:36")


def test_a_job_the_quota_refuses_every_pod_holds_nothing_and_only_waits() -> None:
    assert held_while_refused({}, [event(QUOTA, "15:00:37")], nodes=2) is None


def test_a_pod_that_has_ended_holds_no_quota() -> None:
    ended = {0: pod(0, "15:00:36", phase="Succeeded")}

    assert held_while_refused(ended, [event(QUOTA, "15:00:37")], nodes=2) is None


def test_a_refusal_combined_from_similar_events_still_counts() -> None:
    combined = event(f"(combined from similar events): {QUOTA}", "14:55:00", "14:55:30", 9)

    hold = held_while_refused({0: pod(0, "14:54:05")}, [combined], nodes=2)

    assert hold is not None and hold.since == at("14:55:00")


def test_an_events_api_event_is_read_by_its_event_time_and_series() -> None:
    series = {
        "reason": "FailedCreate",
        "message": QUOTA,
        "eventTime": "2026-12-04T14:54:12.123456Z",
        "series": {"count": 3, "lastObservedTime": "2026-12-04T14:54:20.500000Z"},
    }

    hold = held_while_refused({0: pod(0, "14:54:05")}, [series], nodes=2)

    assert hold is not None and hold.since == at("14:54:12.123456")


def test_several_pods_held_and_several_refused_are_counted_in_the_words() -> None:
    pods = {0: pod(0, "14:54:05"), 1: pod(1, "14:54:05")}

    hold = held_while_refused(pods, [event(QUOTA, "14:54:05")], nodes=4)

    assert hold is not None
    assert hold.held == (
        "2 of 4 pods held 16 GPUs of quota team-ml (limited: requests.nvidia.com/gpu=16)"
    )
    assert hold.waiting == "while the quota refused the pods of nodes 2, 3"


def test_a_quota_on_other_resources_is_named_as_the_quota_writes_it() -> None:
    refusal = quota_refusal(
        "exceeded quota: mem, requested: requests.memory=512Gi, used: requests.memory=1Ti, "
        "limited: requests.memory=1Ti"
    )

    assert refusal is not None
    assert held_of_quota(refusal, 2) == (
        "2 x requests.memory=512Gi of quota mem (limited: requests.memory=1Ti)"
    )


def test_pods_bound_while_another_is_unschedulable_hold_since_the_scheduler_said_so() -> None:
    message = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": message, "lastTransitionTime": "2026-12-04T14:54:06Z"}  # fmt: skip
    pods = {
        0: {**pod(0, "14:54:05"), "spec": {"nodeName": "gpu-node-1"}},
        1: {**pod(1, "14:54:05"), "spec": {"nodeName": "gpu-node-2"}},
        2: {**pod(2, "14:54:05"), "status": {"phase": "Pending", "conditions": [unschedulable]}},
    }

    hold = held_while_waiting(pods, nodes=3)

    assert hold is not None and hold.cause == "Unschedulable"
    assert hold.words(at("14:54:08")) == (
        f"2 of 3 pods held GPUs for 2 s while another could not be placed ({message})"
    )


def test_a_suspended_job_tries_again_between_one_and_two_timeouts_later() -> None:
    now = at("15:00:00")

    assert retry_time(now, 600, draw=lambda: 0.0) == now + timedelta(seconds=600)
    assert retry_time(now, 600, draw=lambda: 0.5) == now + timedelta(seconds=900)
    assert all(
        now + timedelta(seconds=600) <= retry_time(now, 600) < now + timedelta(seconds=1200)
        for _ in range(1000)
    )


def test_two_jobs_suspended_together_seldom_come_back_in_the_same_reconcile_pass() -> None:
    # Uniform over 600 s, two draws fall within one 3 s pass of each other with probability
    # about 2 x 3 / 600 = 1 %; 2 % over 10000 seeded pairs leaves room for the sampling.
    draws = random.Random(41)
    now = at("15:00:00")
    together = 0
    for _ in range(10000):
        a, b = (retry_time(now, 600, draws.random) for _ in range(2))
        together += abs((a - b).total_seconds()) < 3
    assert together / 10000 < 0.02


def suspended_job(patch: dict[str, Any], nodes: int = 2) -> dict[str, Any]:
    """A Job as the API server returns it once the patch zeropilot sent was applied."""
    return {"metadata": {**patch["metadata"]}, "spec": {"completions": nodes, **patch["spec"]}}


def test_a_suspended_job_says_why_and_when_it_tries_again_until_then() -> None:
    hold = held_while_refused({0: pod(0, "14:54:05")}, [event(QUOTA, "14:54:12")], nodes=2)
    assert hold is not None
    now, retry = at("14:54:17"), at("14:54:28.250")

    suspending = suspending_status(hold, now, retry)
    job = suspended_job(suspension(hold, now, retry))
    later = suspended_status(job, at("14:54:20"), retry, 5)

    assert retry_at(job) == retry  # to the millisecond: Jobs a fraction of a second apart stay so
    assert suspending.reason == (
        f"{HELD_8} for 5 s while the quota refused the pod of node 1; zeropilot suspended the "
        "Job to free them and tries again at 2026-12-04T14:54:28Z (in 12 s)"
    )
    assert (later.state, later.native_state) == (BackendState.PENDING, "GangTimeout")
    assert later.reason == (
        f"suspended: {HELD_8} for 5 s while the quota refused the pod of node 1; the Job holds "
        "nothing now, zeropilot tries again at 2026-12-04T14:54:28Z (in 9 s)"
    )


def test_a_job_suspended_before_the_reason_was_kept_reads_as_a_scheduling_timeout() -> None:
    job = {
        "metadata": {"annotations": {"zeropilot.dev/gang-retry-at": "2026-12-04T14:54:28Z"}},
        "spec": {"suspend": True, "completions": 3},
    }
    due = retry_at(job)
    assert due == at("14:54:28")

    status = suspended_status(job, at("14:54:20"), due, 10)

    assert status.reason.startswith("suspended: not all 3 pods could be placed within 10 s;")


def test_a_job_not_suspended_has_no_retry_time() -> None:
    job = {"metadata": {"annotations": {"zeropilot.dev/gang-retry-at": "2026-12-04T14:54:28Z"}},
           "spec": {"suspend": False}}  # fmt: skip

    assert retry_at(job) is None


def test_times_without_a_zone_are_not_read() -> None:
    assert parse_time("2026-12-04T14:54:28") is None
    assert parse_time("not a time") is None
    assert parse_time("2026-12-04T14:54:28Z") == datetime(2026, 12, 4, 14, 54, 28, tzinfo=UTC)
