"""The job and attempt state machines: which status may follow which.

Only ``service.db.transitions`` moves a row, and it asks these tables first; a transition not
listed here is a bug or a race and is refused.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    PENDING = "PENDING"  # stored, not yet admitted (quota, priority)
    QUEUED = "QUEUED"  # admitted; a launch task is on its way
    LAUNCHING = "LAUNCHING"  # a worker is rendering and submitting to the cluster
    RUNNING = "RUNNING"  # the cluster reports the training processes running
    ESCALATING = "ESCALATING"  # an OOM was classified; the next rung of the ladder is being planned
    SUCCEEDED = "SUCCEEDED"  # training exited 0
    FAILED = "FAILED"  # ended with a failure class, no more attempts
    CANCELLED = "CANCELLED"  # a user asked to stop it

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_JOB_STATES

    @classmethod
    def active(cls) -> frozenset[JobStatus]:
        return frozenset(s for s in cls if not s.terminal)


TERMINAL_JOB_STATES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})

_JOB_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.PENDING: frozenset({JobStatus.QUEUED, JobStatus.FAILED, JobStatus.CANCELLED}),
    JobStatus.QUEUED: frozenset({JobStatus.LAUNCHING, JobStatus.FAILED, JobStatus.CANCELLED}),
    JobStatus.LAUNCHING: frozenset(
        {
            JobStatus.RUNNING,
            JobStatus.SUCCEEDED,  # a short job may finish before a poll sees it running
            JobStatus.ESCALATING,
            JobStatus.FAILED,
            JobStatus.CANCELLED,
            JobStatus.PENDING,  # preempted: it waits again, at its original place
        }
    ),
    JobStatus.RUNNING: frozenset(
        {
            JobStatus.SUCCEEDED,
            JobStatus.ESCALATING,
            JobStatus.FAILED,
            JobStatus.CANCELLED,
            JobStatus.PENDING,
        }
    ),
    JobStatus.ESCALATING: frozenset({JobStatus.QUEUED, JobStatus.FAILED, JobStatus.CANCELLED}),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}


class AttemptStatus(StrEnum):
    QUEUED = "QUEUED"
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"  # stopped from outside after saving; the job goes on from there

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL_ATTEMPT_STATES


_TERMINAL_ATTEMPT_STATES = frozenset(
    {
        AttemptStatus.SUCCEEDED,
        AttemptStatus.FAILED,
        AttemptStatus.CANCELLED,
        AttemptStatus.PREEMPTED,
    }
)

_ATTEMPT_TRANSITIONS: dict[AttemptStatus, frozenset[AttemptStatus]] = {
    AttemptStatus.QUEUED: frozenset(
        {AttemptStatus.LAUNCHING, AttemptStatus.FAILED, AttemptStatus.CANCELLED}
    ),
    AttemptStatus.LAUNCHING: frozenset(
        {
            AttemptStatus.RUNNING,
            AttemptStatus.SUCCEEDED,
            AttemptStatus.FAILED,
            AttemptStatus.CANCELLED,
            AttemptStatus.PREEMPTED,
        }
    ),
    AttemptStatus.RUNNING: frozenset(
        {
            AttemptStatus.SUCCEEDED,
            AttemptStatus.FAILED,
            AttemptStatus.CANCELLED,
            AttemptStatus.PREEMPTED,
        }
    ),
    AttemptStatus.SUCCEEDED: frozenset(),
    AttemptStatus.FAILED: frozenset(),
    AttemptStatus.CANCELLED: frozenset(),
    AttemptStatus.PREEMPTED: frozenset(),
}


class InvalidTransition(ValueError):
    """A status change that the state machine does not allow."""


def job_transition_allowed(old: JobStatus, new: JobStatus) -> bool:
    return new in _JOB_TRANSITIONS[old]


def attempt_transition_allowed(old: AttemptStatus, new: AttemptStatus) -> bool:
    return new in _ATTEMPT_TRANSITIONS[old]


def check_job_transition(old: JobStatus, new: JobStatus) -> None:
    if not job_transition_allowed(old, new):
        raise InvalidTransition(f"job cannot go from {old} to {new}")


def check_attempt_transition(old: AttemptStatus, new: AttemptStatus) -> None:
    if not attempt_transition_allowed(old, new):
        raise InvalidTransition(f"attempt cannot go from {old} to {new}")
