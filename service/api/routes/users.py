"""Who am I, and (admins) creating users in teams."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from service.api.deps import AdminUser, CurrentUser, SessionDep
from service.api.schemas import Me, UserCreate, UserCreated
from service.db.models import Team
from service.db.users import create_user

router = APIRouter(prefix="/v1", tags=["users"])


@router.get("/me", response_model=Me)
def me(user: CurrentUser, session: SessionDep) -> Me:
    team = session.get(Team, user.team_id)
    return Me(name=user.name, team=team.name if team else "", is_admin=user.is_admin)


@router.post("/users", status_code=status.HTTP_201_CREATED, response_model=UserCreated)
def add_user(body: UserCreate, _admin: AdminUser, session: SessionDep) -> UserCreated:
    """Create a user (and its team if new); the token in the answer is shown only this once."""
    try:
        token = create_user(session, body.name, body.team, body.is_admin)
    except ValueError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from exc
    session.commit()
    return UserCreated(name=body.name, team=body.team, is_admin=body.is_admin, token=token)
