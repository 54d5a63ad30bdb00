"""Roles inside a team, and what each may do.

Service admins (``is_admin``) run the installation: every team, quotas and shares. Inside a team
a user is a member (submits and cancels the team's jobs), a viewer (reads them: dashboards,
on-call, managers) or a team admin (a member who also adds the team's users), so a team can
onboard people without asking the operators, and cannot touch another team or the quotas.
"""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    MEMBER = "member"
    VIEWER = "viewer"
    TEAM_ADMIN = "team-admin"

    @property
    def can_write(self) -> bool:
        """Submit and cancel the team's jobs."""
        return self is not Role.VIEWER

    @property
    def manages_users(self) -> bool:
        return self is Role.TEAM_ADMIN


def may_write(is_admin: bool, role: str) -> bool:
    """Submit and cancel the team's jobs: a service admin, or any role but viewer."""
    return is_admin or Role(role).can_write


def viewer_refusal(name: str) -> str:
    """Why a viewer's submit or cancel is refused."""
    return f"user {name} is a viewer: viewers read jobs but cannot submit or cancel"


def may_create_user(
    caller_is_admin: bool, caller_role: Role, caller_team: str, team: str, makes_admin: bool
) -> str | None:
    """Why the caller may not create this user, or None when it may."""
    if caller_is_admin:
        return None
    if not caller_role.manages_users:
        return "creating users needs a service admin or a team admin token"
    if team != caller_team:
        return f"a team admin of {caller_team!r} can only add users to {caller_team!r}"
    if makes_admin:
        return "only a service admin can create service admins"
    return None
