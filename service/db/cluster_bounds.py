"""Limits a cluster sets on zeropilot's GPUs (``ClusterBound`` rows), and each cluster's cap.

A Kubernetes namespace's GPU quota bounds what zeropilot can run there, whatever the profile's
``max_gpus`` says: admitting past it would launch Jobs whose pods the quota refuses. Workers read
the quota on the cluster and record it here (``record_bound``); admission, placement, advice and
start estimates read each cluster's cap through ``cap_of`` / ``caps_of``, the lower of the two.
"""

from __future__ import annotations

from sqlmodel import Session, col, delete, select

from service.core.admission import Cap, bounded_cap
from service.core.clusters import BackendKind, ClusterProfile
from service.db.models import ClusterBound, utcnow

# Only these kinds have limits of their own that a worker reads: no statement for the others.
BOUNDED_KINDS = frozenset({BackendKind.KUBERNETES})


def cap_of(session: Session, profile: ClusterProfile) -> Cap:
    """The cluster's cap: one read by primary key, none for a kind that sets no bound."""
    if profile.kind not in BOUNDED_KINDS:
        return Cap(profile.max_gpus)
    return _cap(profile, session.get(ClusterBound, profile.name))


def caps_of(session: Session, profiles: dict[str, ClusterProfile]) -> dict[str, Cap]:
    """Every cluster's cap, in one statement (none where no profile can be bounded)."""
    names = [name for name, p in profiles.items() if p.kind in BOUNDED_KINDS]
    bounds: dict[str, ClusterBound] = {}
    if names:
        query = select(ClusterBound).where(col(ClusterBound.cluster).in_(names))
        bounds = {row.cluster: row for row in session.exec(query).all()}
    return {name: _cap(p, bounds.get(name)) for name, p in profiles.items()}


def record_bound(session: Session, cluster: str, bound: tuple[int, str] | None) -> None:
    """Keep what a worker read on the cluster: the GPUs and the limit in words, or no limit."""
    row = session.get(ClusterBound, cluster)
    if bound is None:
        if row is not None:
            session.exec(delete(ClusterBound).where(col(ClusterBound.cluster) == cluster))
        return
    gpus, source = bound
    if row is None:
        row = ClusterBound(cluster=cluster, gpus=gpus, source=source)
    elif (row.gpus, row.source) == (gpus, source):
        return  # unchanged: no write on every read
    row.gpus, row.source, row.observed_at = gpus, source[:500], utcnow()
    session.add(row)


def _cap(profile: ClusterProfile, row: ClusterBound | None) -> Cap:
    if row is None:
        return Cap(profile.max_gpus)
    return bounded_cap(profile.max_gpus, row.gpus, row.source)
