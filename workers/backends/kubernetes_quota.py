"""A namespace's GPU quota: the most GPUs zeropilot's pods there can ask for at once.

Admission bounds a Kubernetes cluster by it (``service.db.cluster_bounds``): past it, the API
server refuses the pods of a Job that zeropilot launched, and the Job waits holding what it got.
Only quotas without scopes count: a scoped quota (by priority class, say) may not apply to
zeropilot's pods. Pure: the caller lists the ResourceQuotas.
"""

from __future__ import annotations

import math
from typing import Any

from workers.backends.kubernetes_events import quantity

Json = dict[str, Any]


def gpu_bound(quotas: list[Json], resource: str) -> tuple[int, str] | None:
    """The tightest hard limit on ``resource`` (e.g. ``nvidia.com/gpu``) among the quotas, and
    which quota sets it in words; None when no quota limits it."""
    keys = (f"requests.{resource}", f"limits.{resource}", resource)
    found: list[tuple[int, str]] = []
    for quota in quotas:
        spec = quota.get("spec") or {}
        if spec.get("scopes") or spec.get("scopeSelector"):
            continue
        hard = spec.get("hard") or {}
        for key in keys:
            amount = quantity(str(hard[key])) if key in hard else None
            if amount is not None:
                metadata = quota.get("metadata") or {}
                where = f"{metadata.get('namespace')}/{metadata.get('name')}"
                found.append((math.floor(amount), f"namespace quota {where}: {key}={hard[key]}"))
    return min(found, default=None)
