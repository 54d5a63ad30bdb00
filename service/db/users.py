"""Teams and users: creation, lookup by bearer token, and the first admin."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import bindparam
from sqlalchemy import select as sql_select
from sqlmodel import Session, col, func, select

from service.core.roles import Role, may_write
from service.db import plain
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


@dataclass(frozen=True)
class Caller:
    """A token's user and team as plain values: what a submit needs, read in one statement."""

    user_id: int
    user_name: str
    is_admin: bool
    role: str
    team_id: int
    team_name: str
    gpu_quota: int | None  # the team's

    @classmethod
    def of(cls, user: User, team: Team) -> Caller:
        assert user.id is not None
        return cls(user.id, user.name, user.is_admin, user.role, user.team_id, team.name,
                   team.gpu_quota)  # fmt: skip

    @property
    def can_write(self) -> bool:
        """Submit and cancel the team's jobs (anyone but a viewer)."""
        return may_write(self.is_admin, self.role)


_CALLER = (
    sql_select(
        *[col(c) for c in (User.id, User.name, User.is_admin, User.role)],
        *[col(c) for c in (Team.id, Team.name, Team.gpu_quota)],
    )
    .join(Team)
    .where(col(User.token_hash) == bindparam("token_hash"))
)


def caller_by_token(session: Session, token: str) -> Caller | None:
    """The token's caller, without ORM objects (``plain``): the submit's hot path."""
    (row,) = plain.execute(session, _CALLER, [{"token_hash": hash_token(token)}], fetch=True)
    if row is None:
        return None
    user_id, user_name, is_admin, role, team_id, team_name, gpu_quota = row
    return Caller(user_id, user_name, bool(is_admin), role, team_id, team_name, gpu_quota)


def bootstrap_admin(session: Session) -> str | None:
    """On a database without users, create team 'default' and user 'admin'; return its token."""
    if session.exec(select(func.count()).select_from(User)).one() > 0:
        return None
    return create_user(session, "admin", "default", is_admin=True)


def checkpoint_roots_of(session: Session, team_id: int) -> list[str]:
    """The folders where the team's jobs may name their own checkpoint.dir."""
    roots = session.exec(select(Team.checkpoint_roots).where(Team.id == team_id)).first()
    return list(roots or [])


def team_names(session: Session) -> dict[int, str]:
    """Every team's name by id."""
    return {t.id: t.name for t in session.exec(select(Team)).all() if t.id is not None}


def team_id_named(session: Session, name: str) -> int | None:
    return session.exec(select(Team.id).where(Team.name == name)).first()
