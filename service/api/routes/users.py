"""Who am I, and creating users: service admins in any team, team admins in their own."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from service.api.deps import CurrentUser, SessionDep
from service.api.errors import error_responses
from service.api.schemas import Me, UserCreate, UserCreated
from service.core.roles import Role, may_create_user
from service.db.models import Team
from service.db.users import create_user

router = APIRouter(prefix="/v1", tags=["users"], responses=error_responses(401))


@router.get("/me", response_model=Me)
def me(user: CurrentUser, session: SessionDep) -> Me:
    team = session.get(Team, user.team_id)
    return Me(
        name=user.name, team=team.name if team else "", is_admin=user.is_admin, role=Role(user.role)
    )


@router.post(
    "/users",
    status_code=status.HTTP_201_CREATED,
    response_model=UserCreated,
    responses=error_responses(403, 409),
)
def add_user(body: UserCreate, caller: CurrentUser, session: SessionDep) -> UserCreated:
    """Create a user (and its team if new); the token in the answer is shown only this once."""
    team = session.get(Team, caller.team_id)
    caller_team = team.name if team else ""
    why = may_create_user(caller.is_admin, Role(caller.role), caller_team, body.team, body.is_admin)
    if why is not None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail=why)
    try:
        token = create_user(session, body.name, body.team, body.is_admin, body.role)
    except ValueError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from exc
    session.commit()
    return UserCreated(
        name=body.name, team=body.team, is_admin=body.is_admin, role=body.role, token=token
    )
