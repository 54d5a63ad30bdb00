"""The Job controller's ``FailedCreate`` events: why a Job has fewer pods than nodes.

When the API server refuses a pod the Job controller tries to create (a quota, a pod-level
validation rule that a Job's template does not meet, an admission policy), the only record is
an event on the Job. A refusal that no wait can cure (the pod is invalid, forbidden, or the
Job's pods together ask for more of a resource than the quota's hard limit) fails the attempt;
a quota that other jobs fill today leaves it PENDING with the quota's words. Pure: the caller
lists the events.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from workers.backends.base import BackendState, BackendStatus

Json = dict[str, Any]
FAILED_CREATE = "FailedCreate"
_QUOTA = re.compile(
    r"exceeded quota: (?P<quota>[^,]+), requested: (?P<requested>.+?), used: .+?, "
    r"limited: (?P<limited>[^\s]+)"
)
_SUFFIXES: dict[str, Decimal | int] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": 10**3, "M": 10**6,
    "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip
_PERMANENT = ("is invalid", "is forbidden")
# Forbidden for now only: a namespace's default ServiceAccount appears a moment after it.
_PASSING = ("error looking up service account",)


def failed_create(events: list[Json], pods: int) -> BackendStatus | None:
    """The newest FailedCreate event of a Job of ``pods`` pods as a status: FAILED when
    permanent, else PENDING."""
    refusals = [e for e in events if e.get("reason") == FAILED_CREATE]
    if not refusals:
        return None
    newest = max(refusals, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    message = str(newest.get("message") or "")
    if _QUOTA.search(message):
        overflow = quota_overflow(message, pods)
        permanent = overflow is not None
        why = overflow or "waiting for quota"
    else:
        permanent = any(w in message for w in _PERMANENT) and not any(
            w in message for w in _PASSING
        )
        why = "the API server refused the pod" if permanent else "retrying"
    state = BackendState.FAILED if permanent else BackendState.PENDING
    done = "; zeropilot deleted the Job" if permanent else ""
    reason = f"the Job controller cannot create a pod ({why}): {message}{done}"
    return BackendStatus(state, native_state=FAILED_CREATE, reason=reason)


def quota_overflow(message: str, pods: int) -> str | None:
    """Why a Job of ``pods`` pods, each asking what the quota refusal says one pod asks, can
    never fit the quota's hard limit, in words; None when it would fit once others release
    theirs. Every pod of the gang must run at once, so the whole Job's request counts."""
    found = _QUOTA.search(message)
    if found is None:
        return None
    requested, limited = _amounts(found["requested"]), _amounts(found["limited"])
    for name, (text, amount) in requested.items():
        if name in limited and amount * pods > limited[name][1]:
            return (
                f"its {pods} pods need {pods} x {name}={text}, more than the quota's hard "
                f"limit {name}={limited[name][0]}"
            )
    return None


@dataclass(frozen=True)
class QuotaRefusal:
    """What a quota's refusal of a pod says: the quota, and what the pod asked of it (only the
    resources it exceeds) beside the quota's hard limit on them."""

    quota: str
    requested: dict[str, tuple[str, Decimal]]
    limited: str  # as the message writes it: requests.nvidia.com/gpu=16


def quota_refusal(message: str) -> QuotaRefusal | None:
    """The quota refusal in a FailedCreate message; None when no quota refused the pod."""
    found = _QUOTA.search(message)
    if found is None:
        return None
    return QuotaRefusal(found["quota"].strip(), _amounts(found["requested"]), found["limited"])


def held_of_quota(refusal: QuotaRefusal, pods: int) -> str:
    """What ``pods`` pods, each asking what the refused one asked, hold of the quota, in words:
    ``8 GPUs of quota team-ml (limited: requests.nvidia.com/gpu=16)``."""
    held = []
    for name, (text, amount) in refusal.requested.items():
        if name.endswith("gpu") and amount == amount.to_integral_value():
            held.append(f"{int(amount) * pods} GPUs")
        else:
            held.append(f"{name}={text}" if pods == 1 else f"{pods} x {name}={text}")
    return f"{', '.join(held)} of quota {refusal.quota} (limited: {refusal.limited})"


def _amounts(text: str) -> dict[str, tuple[str, Decimal]]:
    """``requests.nvidia.com/gpu=8,requests.memory=512Gi`` as written and as numbers."""
    amounts = {}
    for pair in text.split(","):
        name, _, value = pair.strip().partition("=")
        if (number := quantity(value)) is not None:
            amounts[name] = (value.strip(), number)
    return amounts


def quantity(text: str) -> Decimal | None:
    """A Kubernetes quantity (``8``, ``512Gi``, ``500m``, ``1e3``) as a number."""
    match = re.fullmatch(r"([0-9.eE+-]+?)([KMGTPE]i|[numkMGTPE])?", text.strip())
    if match is None:
        return None
    try:
        return Decimal(match[1]) * Decimal(_SUFFIXES.get(match[2] or "", 1))
    except InvalidOperation:
        return None
