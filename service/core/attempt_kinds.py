"""Why an attempt exists, and which budget it spends: one table.

Attempt 1 is the advisor's; every later attempt is made for one reason, its kind. The kind, not
the rung (the words a person reads), decides what the attempt costs: whether it uses one of the
spec's ``escalation.max_attempts`` (the user's own failures), and how many attempts of its kind
a job may have. A new recovery adds a kind and a row here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType


class AttemptKind(StrEnum):
    ADVISOR = "advisor"  # attempt 1: the advisor's plan for the job as submitted
    ESCALATION = "escalation"  # re-planned after running out of memory, up the ladder
    OOM_RETRY = "oom_retry"  # the same plan after an OOM other processes on the GPU caused
    DISRUPTION = "disruption"  # the same plan after the cluster took a node away
    STOP = "stop"  # the same plan from the save at a stop from outside zeropilot (a drain)
    PREEMPTION = "preemption"  # the same plan after zeropilot stopped it for another job
    REPLACEMENT = "replacement"  # another cluster's plan after the launch failed for good
    # The same plan after a fault that is not the user's: an NCCL (or gloo) timeout or error
    # today; hangs and bad nodes, with that node left out, are coming.
    FAULT_RETRY = "fault_retry"
    # Coming (design: "What follows an attempt's end"): the same job on other nodes or fewer.
    # Nothing makes one yet.
    RESIZE = "resize"


@dataclass(frozen=True)
class Budget:
    uses_max_attempts: bool  # counts toward the spec's escalation.max_attempts
    own_limit: int | None  # at most this many attempts of the kind per job; None: no own limit


MAX_DISRUPTION_RETRIES = 3  # a cluster that keeps taking nodes away ends the job
MAX_STOP_RESUMES = 20  # larger: a stop that was saved at loses nothing
MAX_FAULT_RETRIES = 3  # a communicator that keeps failing is more than a passing fault

_USERS = Budget(uses_max_attempts=True, own_limit=None)
_NOT_COUNTED = Budget(uses_max_attempts=False, own_limit=None)

# Replacement needs no limit of its own (a cluster where a launch failed is never chosen again),
# nor preemption (its policy never lets two jobs preempt each other back and forth). The coming
# kinds get their limits with the recoveries that make them.
BUDGETS: Mapping[AttemptKind, Budget] = MappingProxyType(
    {
        AttemptKind.ADVISOR: _USERS,
        AttemptKind.ESCALATION: _USERS,
        AttemptKind.OOM_RETRY: _USERS,
        AttemptKind.DISRUPTION: Budget(uses_max_attempts=False, own_limit=MAX_DISRUPTION_RETRIES),
        AttemptKind.STOP: Budget(uses_max_attempts=False, own_limit=MAX_STOP_RESUMES),
        AttemptKind.PREEMPTION: _NOT_COUNTED,
        AttemptKind.REPLACEMENT: _NOT_COUNTED,
        AttemptKind.FAULT_RETRY: Budget(uses_max_attempts=False, own_limit=MAX_FAULT_RETRIES),
        AttemptKind.RESIZE: _NOT_COUNTED,
    }
)


def max_attempts_used(kinds: Iterable[str]) -> int:
    """How many of the spec's ``escalation.max_attempts`` a job's attempts (their kinds) used."""
    return sum(1 for kind in kinds if BUDGETS[AttemptKind(kind)].uses_max_attempts)


def within_own_limit(kinds: Iterable[str], kind: AttemptKind) -> bool:
    """Whether a job whose attempts are of ``kinds`` may have one more attempt of ``kind``."""
    limit = BUDGETS[kind].own_limit
    return limit is None or sum(1 for k in kinds if k == kind) < limit
