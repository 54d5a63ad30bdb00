"""Teams and users: creation, lookup by bearer token, and the first admin."""

from __future__ import annotations

from sqlmodel import Session, func, select

from service.core.roles import Role
from service.db.models import Team, User
from service.security import hash_token, new_user_token


def get_or_create_team(session: Session, name: str) -> Team:
    team = session.exec(select(Team).where(Team.name == name)).first()
    if team is None:
        team = Team(name=name)
        session.add(team)
        session.flush()
    return team


def create_user(
    session: Session,
    name: str,
    team_name: str,
    is_admin: bool = False,
    role: Role = Role.MEMBER,
) -> str:
    """Create a user in a team (creating the team if needed); return the token, shown once."""
    if session.exec(select(User).where(User.name == name)).first() is not None:
        raise ValueError(f"a user named {name!r} already exists")
    team = get_or_create_team(session, team_name)
    token = new_user_token()
    assert team.id is not None
    user = User(
        name=name, team_id=team.id, is_admin=is_admin, role=role, token_hash=hash_token(token)
    )
    session.add(user)
    session.flush()
    return token


def user_by_token(session: Session, token: str) -> User | None:
    found = member_by_token(session, token)
    return found[0] if found else None


def member_by_token(session: Session, token: str) -> tuple[User, Team] | None:
    """The token's user and their team, in one statement."""
    query = select(User, Team).join(Team).where(User.token_hash == hash_token(token))
    row = session.exec(query).first()
    return (row[0], row[1]) if row else None


def bootstrap_admin(session: Session) -> str | None:
    """On a database without users, create team 'default' and user 'admin'; return its token."""
    if session.exec(select(func.count()).select_from(User)).one() > 0:
        return None
    return create_user(session, "admin", "default", is_admin=True)
