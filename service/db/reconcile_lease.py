"""The reconcile lease: a worker's pass takes the one ``ReconcileLease`` row before it polls,
so two workers' beats never run passes over the same attempts at once. A lease, not a row lock
held through the pass: a pass makes cluster calls for seconds, and a transaction open that long
would hold a connection and block the writes it makes itself. A pass renews it as it goes; a
worker that dies mid-pass frees it when it lapses.
"""

from __future__ import annotations

from sqlalchemy import or_, update
from sqlmodel import Session, col

from service.db.models import ReconcileLease


def take_lease(session: Session, holder: str, now: float, lease_s: float) -> bool:
    """Take (or renew) the lease for ``holder``; False while another holder's has not lapsed."""
    taken = session.execute(
        update(ReconcileLease)
        .where(
            col(ReconcileLease.id) == 1,
            or_(
                col(ReconcileLease.holder) == holder,
                col(ReconcileLease.expires_unix_s) < now,
            ),
        )
        .values(holder=holder, expires_unix_s=now + lease_s)
    )
    return bool(getattr(taken, "rowcount", 0) == 1)


def release_lease(session: Session, holder: str) -> None:
    session.execute(
        update(ReconcileLease)
        .where(col(ReconcileLease.id) == 1, col(ReconcileLease.holder) == holder)
        .values(expires_unix_s=0.0)
    )
