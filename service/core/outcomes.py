"""What follows an attempt's end: one decision, read as one table (docs/lifecycle.md).

Every way an attempt ends (it succeeded, its job was cancelled, zeropilot stopped it for another
job, the cluster took a node away, it was stopped from outside and saved, it ran out of memory,
its launch failed for good, anything else) maps here to one outcome: finish, requeue, retry the
same plan, escalate, re-place, or fail. The rules are tried in order, the first that applies
decides; each says which budget its next attempt spends (``attempt_kinds``). ``workers.outcomes``
gathers the facts and carries the outcome out through the status writer.

Pure. What costs work to know (a new plan after an out-of-memory failure, another cluster
after a failed launch) arrives as a function the decision calls only when its rule is reached.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from service.core.advisor import Candidate
from service.core.attempt_kinds import AttemptKind, max_attempts_used, within_own_limit
from service.core.escalation import Decision as Replan
from service.core.failures import FailureClass


class Phase(StrEnum):
    LAUNCH = "launch"  # the launch failed for good: no process ever ran
    RUN = "run"  # the cluster ran it and says how it ended


@dataclass(frozen=True)
class Ending:
    """How an attempt ended, as its cluster and the failure classifier saw it."""

    phase: Phase
    succeeded: bool  # every process exited 0
    failure: FailureClass | None  # None when it succeeded
    lost: bool = False  # the cluster no longer knows the run (deleted behind zeropilot's back)
    summary: str = ""  # the failure in words: class, how it ended, the line that ended it
    native_state: str | None = None  # the cluster's own word for the end (NODE_FAIL, Evicted)


@dataclass(frozen=True)
class Elsewhere:
    """Another cluster placement chose for a job whose launch failed for good."""

    cluster: str
    plan: Candidate  # the plan made for that cluster
    words: str  # placement's choice and the others, for the job's record


@dataclass(frozen=True)
class Facts:
    """Everything the decision reads about a job whose attempt has ended."""

    ending: Ending
    job_cancelled: bool  # a user cancelled the job before the attempt ended
    stopping_for: str | None  # the job zeropilot stopped this one for (a preemption)
    kinds: tuple[AttemptKind, ...]  # the kinds of the job's attempts so far, this one included
    escalation_enabled: bool
    max_attempts: int  # the spec's escalation.max_attempts
    evidence: str = ""  # the failure's numbers in words (``escalation.Evidence.describe``)
    # The re-plan after an out-of-memory failure (``escalation.replan`` with the evidence).
    replan: Callable[[], Replan] = lambda: Replan("stop", "no re-planning given")
    # Another cluster for a job placed by zeropilot, or why none can run it ("" : the job
    # names its cluster, nothing to add).
    replace: Callable[[], Elsewhere | str] = lambda: ""


# ---- the outcomes: a closed set ----


@dataclass(frozen=True)
class Succeed:
    """The run exited 0: attempt and job SUCCEEDED."""


@dataclass(frozen=True)
class FinishedBeforeCancel:
    """The run exited 0 before the cancel reached it: the attempt SUCCEEDED, the job stays
    CANCELLED (an ended job never moves), and its last checkpoint is whole."""


@dataclass(frozen=True)
class Cancel:
    """The attempt ends CANCELLED; the job is (or becomes, when the cluster cancelled it)
    CANCELLED."""

    by_cluster: bool  # cancelled on the cluster, not through zeropilot


@dataclass(frozen=True)
class Requeue:
    """Stopped for another job: back in line at the job's original place, the same plan from
    the newest checkpoint, as a preemption attempt (no budget)."""

    preemptor: str


@dataclass(frozen=True)
class Retry:
    """The same plan again from the newest checkpoint, as an attempt of ``kind``."""

    kind: AttemptKind


@dataclass(frozen=True)
class Escalate:
    """A new plan (or the same, when others crowded the GPU) from the newest checkpoint."""

    kind: AttemptKind  # ESCALATION, or OOM_RETRY for the same plan
    replan: Replan


@dataclass(frozen=True)
class Replace:
    """Another cluster for a job whose launch failed for good: back to PENDING there."""

    elsewhere: Elsewhere


@dataclass(frozen=True)
class Fail:
    """The job ends FAILED with the class and the message (the failure and why nothing
    follows it, with the numbers)."""

    failure: FailureClass
    message: str
    note: str = ""  # why no re-plan, for an event on the attempt ("" : nothing to add)


Outcome = Succeed | FinishedBeforeCancel | Cancel | Requeue | Retry | Escalate | Replace | Fail


def decide(facts: Facts) -> Outcome:
    """The one rule that applies first, in the order of docs/lifecycle.md's table."""
    ending = facts.ending
    if facts.job_cancelled:
        return FinishedBeforeCancel() if ending.succeeded else Cancel(by_cluster=False)
    if ending.succeeded:
        return Succeed()
    if facts.stopping_for is not None and ending.phase == Phase.RUN:
        return Requeue(facts.stopping_for)
    failure = ending.failure or FailureClass.USER_ERROR
    if ending.phase == Phase.LAUNCH:
        return _after_failed_launch(facts, failure)
    kind = _disruption_kind(ending, failure)
    if kind is not None and within_own_limit(facts.kinds, kind):
        return Retry(kind)
    if failure.out_of_memory and facts.escalation_enabled:
        return _after_out_of_memory(facts, failure)
    if failure == FailureClass.CANCELLED:
        return Cancel(by_cluster=True)
    return Fail(failure, ending.summary)


def _disruption_kind(ending: Ending, failure: FailureClass) -> AttemptKind | None:
    """A node taken away (the cluster still knew the run), a stop from outside that the
    training answered by saving, a collective that timed out or failed: not the job's fault,
    the same plan goes on."""
    if ending.lost:
        return None
    if failure == FailureClass.NODE_LOST:
        return AttemptKind.DISRUPTION
    if failure == FailureClass.PREEMPTED:
        return AttemptKind.STOP
    if failure in (FailureClass.NCCL_TIMEOUT, FailureClass.NCCL_ERROR, FailureClass.HANG):
        return AttemptKind.FAULT_RETRY  # the communicator or a node, almost never the user's code
    return None


def _after_out_of_memory(facts: Facts, failure: FailureClass) -> Outcome:
    used = max_attempts_used(facts.kinds)
    if used >= facts.max_attempts:
        why = f"not re-planned: {used} of at most {facts.max_attempts} attempts used"
        return Fail(failure, f"{facts.ending.summary}; {why}")
    replan = facts.replan()
    if replan.action == "stop" or replan.plan is None:
        why = f"not re-planned: {replan.reason} ({facts.evidence})"
        return Fail(failure, f"{facts.ending.summary}; {why}", note=why)
    kind = AttemptKind.OOM_RETRY if replan.action == "retry" else AttemptKind.ESCALATION
    return Escalate(kind, replan)


def _after_failed_launch(facts: Facts, failure: FailureClass) -> Outcome:
    found = facts.replace()
    if isinstance(found, Elsewhere):
        return Replace(found)
    why_not = found
    message = f"{facts.ending.summary}; {why_not}" if why_not else facts.ending.summary
    return Fail(failure, message)
