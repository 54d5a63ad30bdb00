"""FastAPI dependencies: settings, a database session, the calling user, the reporting attempt."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlmodel import Session

from service.core.roles import may_write, viewer_refusal
from service.core.states import AttemptStatus, JobStatus
from service.db.jobs import get_job
from service.db.models import Attempt, Job, Team, User
from service.db.session import get_engine
from service.db.users import member_by_token
from service.security import MISSING_TOKEN, UNKNOWN_TOKEN, attempt_token_valid
from service.settings import Settings

bearer = HTTPBearer(auto_error=False)


# Dependencies that do no I/O are async: a sync one costs a hop to the thread pool per request.
async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_db(settings: SettingsDep) -> Iterator[Session]:
    with Session(get_engine(settings.database_url)) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_db)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def unauthorized(detail: str) -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail=detail, headers={"WWW-Authenticate": "Bearer"}
    )


@dataclass(frozen=True)
class Member:
    """The caller and their team, read in one statement."""

    user: User
    team: Team


def get_member(session: SessionDep, credentials: Credentials) -> Member:
    return member_of(session, credentials)


def member_of(session: Session, credentials: HTTPAuthorizationCredentials | None) -> Member:
    """The caller behind the bearer token, or 401."""
    found = member_by_token(session, _token(credentials))
    if found is None:
        raise unauthorized(UNKNOWN_TOKEN)
    return Member(*found)


def _token(credentials: HTTPAuthorizationCredentials | None) -> str:
    if credentials is None:
        raise unauthorized(MISSING_TOKEN)
    return credentials.credentials


CurrentMember = Annotated[Member, Depends(get_member)]


async def get_current_user(member: CurrentMember) -> User:
    return member.user


CurrentUser = Annotated[User, Depends(get_current_user)]


def visible_job(session: Session, user: User, job_id: str) -> Job:
    """The job, if the user may see it; else 404 (another team's job is "not found", not
    "forbidden": its existence is not disclosed)."""
    job = get_job(session, job_id, None if user.is_admin else user.team_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"job {job_id} not found")
    return job


async def get_admin(user: CurrentUser) -> User:
    if not user.is_admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="this needs an admin token")
    return user


AdminUser = Annotated[User, Depends(get_admin)]


def writing(member: Member) -> Member:
    """The member, if they may submit and cancel (anyone but a viewer), or 403."""
    user = member.user
    if not may_write(user.is_admin, user.role):
        raise _viewer(user.name)
    return member


def _viewer(name: str) -> HTTPException:
    return HTTPException(status.HTTP_403_FORBIDDEN, detail=viewer_refusal(name))


async def get_writer(member: CurrentMember) -> User:
    return writing(member).user


WriterUser = Annotated[User, Depends(get_writer)]


def get_reporting_attempt(
    attempt_id: str, session: SessionDep, settings: SettingsDep, credentials: Credentials
) -> Attempt:
    """The attempt a training process reports for, proven by its runtime token."""
    if credentials is None:
        raise unauthorized("missing attempt token")
    if not attempt_token_valid(settings.secret_key(), attempt_id, credentials.credentials):
        raise unauthorized("attempt token does not match this attempt")
    attempt = session.get(Attempt, attempt_id)
    if attempt is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"attempt {attempt_id} not found")
    if why := _token_expired(attempt, session.get(Job, attempt.job_id)):
        raise unauthorized(f"attempt token expired: {why}; reports are no longer accepted")
    return attempt


def _token_expired(attempt: Attempt, job: Job | None) -> str | None:
    """Why a valid token no longer holds: it lives as long as its attempt (a leftover process
    of an ended or cancelled attempt cannot write metrics or checkpoints into the job). A
    cancelled job's running attempt is stopping: it may still report the save it makes."""
    stopping = attempt.status in (AttemptStatus.LAUNCHING, AttemptStatus.RUNNING)
    if job is None or (job.status == JobStatus.CANCELLED and not stopping):
        return f"job {attempt.job_id} was cancelled"
    if AttemptStatus(attempt.status).terminal:
        return f"attempt {attempt.number} of job {job.id} ended {attempt.status}"
    return None


ReportingAttempt = Annotated[Attempt, Depends(get_reporting_attempt)]
