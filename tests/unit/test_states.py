"""Every allowed and every forbidden transition of the job and attempt state machines."""

from __future__ import annotations

import itertools

import pytest

from service.core.states import (
    AttemptStatus,
    InvalidTransition,
    JobStatus,
    attempt_transition_allowed,
    check_attempt_transition,
    check_job_transition,
    job_transition_allowed,
)

J = JobStatus
JOB_ALLOWED = {
    (J.PENDING, J.QUEUED),
    (J.PENDING, J.FAILED),
    (J.PENDING, J.CANCELLED),
    (J.QUEUED, J.LAUNCHING),
    (J.QUEUED, J.FAILED),
    (J.QUEUED, J.CANCELLED),
    (J.LAUNCHING, J.RUNNING),
    (J.LAUNCHING, J.SUCCEEDED),
    (J.LAUNCHING, J.ESCALATING),
    (J.LAUNCHING, J.FAILED),
    (J.LAUNCHING, J.CANCELLED),
    (J.RUNNING, J.SUCCEEDED),
    (J.RUNNING, J.ESCALATING),
    (J.RUNNING, J.FAILED),
    (J.RUNNING, J.CANCELLED),
    (J.LAUNCHING, J.PENDING),  # preempted: back in line at its original place
    (J.RUNNING, J.PENDING),
    (J.ESCALATING, J.QUEUED),
    (J.ESCALATING, J.FAILED),
    (J.ESCALATING, J.CANCELLED),
}
A = AttemptStatus
ATTEMPT_ALLOWED = {
    (A.QUEUED, A.LAUNCHING),
    (A.QUEUED, A.FAILED),
    (A.QUEUED, A.CANCELLED),
    (A.LAUNCHING, A.RUNNING),
    (A.LAUNCHING, A.SUCCEEDED),
    (A.LAUNCHING, A.FAILED),
    (A.LAUNCHING, A.CANCELLED),
    (A.RUNNING, A.SUCCEEDED),
    (A.RUNNING, A.FAILED),
    (A.RUNNING, A.CANCELLED),
    (A.LAUNCHING, A.PREEMPTED),  # stopped from outside after saving
    (A.RUNNING, A.PREEMPTED),
}


@pytest.mark.parametrize("old,new", list(itertools.product(JobStatus, JobStatus)))
def test_job_transition(old: JobStatus, new: JobStatus) -> None:
    allowed = (old, new) in JOB_ALLOWED
    assert job_transition_allowed(old, new) is allowed
    if allowed:
        check_job_transition(old, new)
    else:
        with pytest.raises(InvalidTransition, match=f"from {old} to {new}"):
            check_job_transition(old, new)


@pytest.mark.parametrize("old,new", list(itertools.product(AttemptStatus, AttemptStatus)))
def test_attempt_transition(old: AttemptStatus, new: AttemptStatus) -> None:
    allowed = (old, new) in ATTEMPT_ALLOWED
    assert attempt_transition_allowed(old, new) is allowed
    if not allowed:
        with pytest.raises(InvalidTransition):
            check_attempt_transition(old, new)


def test_terminal_states_have_no_way_out() -> None:
    for status in (J.SUCCEEDED, J.FAILED, J.CANCELLED):
        assert status.terminal
        assert not any(job_transition_allowed(status, new) for new in JobStatus)
    assert J.active() == {J.PENDING, J.QUEUED, J.LAUNCHING, J.RUNNING, J.ESCALATING}


def test_ended_attempts_have_no_way_out() -> None:
    for status in (A.SUCCEEDED, A.FAILED, A.CANCELLED, A.PREEMPTED):
        assert status.terminal
        assert not any(attempt_transition_allowed(status, new) for new in AttemptStatus)
