"""Who borrows and who lends: each team's GPUs against its nominal quota, as the teams page,
``zeropilot teams list`` and ``/metrics`` show them.

A team holding more than its quota borrows the difference. The GPUs it borrows come out of the
pool's idle quota (service.core.admission); each team with idle quota is counted as lending a
part of them, in proportion to the quota it leaves idle, so the lent GPUs add up to the borrowed
ones (fewer where a cluster cap lets borrowers run past every quota). Teams without a quota have
no limit and stand outside the pool: they neither borrow nor lend. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TeamSharing:
    nominal: int | None  # the team's quota; None: no limit
    held: int  # GPUs its admitted, unfinished jobs hold
    borrowed: int  # held past its quota
    lent: int  # of its idle quota, what other teams' borrowing jobs use now


def sharing(held: dict[str, int], quotas: dict[str, int | None]) -> dict[str, TeamSharing]:
    """Each team's nominal, held, borrowed and lent GPUs (teams are the keys of ``quotas``)."""
    borrowed = {
        team: max(0, held.get(team, 0) - quota)
        for team, quota in quotas.items()
        if quota is not None
    }
    idle = {
        team: max(0, quota - held.get(team, 0))
        for team, quota in quotas.items()
        if quota is not None
    }
    lent = _split(min(sum(borrowed.values()), sum(idle.values())), idle)
    return {
        team: TeamSharing(quota, held.get(team, 0), borrowed.get(team, 0), lent.get(team, 0))
        for team, quota in quotas.items()
    }


def _split(total: int, weights: dict[str, int]) -> dict[str, int]:
    """``total`` in whole GPUs in proportion to ``weights`` (largest remainders first, then
    by name, so the same state always splits the same way)."""
    whole = sum(weights.values())
    if total <= 0 or whole <= 0:
        return {}
    shares = {team: total * weight // whole for team, weight in weights.items()}
    left = total - sum(shares.values())
    by_remainder = sorted(weights, key=lambda team: (-(total * weights[team] % whole), team))
    for team in by_remainder[:left]:
        shares[team] += 1
    return shares
