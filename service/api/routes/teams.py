"""Teams: their GPU quotas, fair-share weights and what they hold now (admins change them)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from sqlmodel import Session, col, func, select

from service.api.deps import AdminUser, CurrentUser, SessionDep, SettingsDep
from service.api.errors import body_field_error, error_responses
from service.api.schemas import TeamPublic, TeamReport, TeamUpdate
from service.api.team_report import team_report
from service.checkpoint_paths import roots_conflict
from service.core.periods import parse_since
from service.core.sharing import TeamSharing, sharing
from service.core.states import JobStatus
from service.db.admission import admit_pending, held
from service.db.models import Job, Team
from service.settings import Settings
from service.tasks import LAUNCH_ATTEMPT, send_or_leave_to_sweep

router = APIRouter(prefix="/v1/teams", tags=["teams"], responses=error_responses(401))


@router.get("", response_model=list[TeamPublic])
def list_teams(user: CurrentUser, session: SessionDep) -> list[TeamPublic]:
    """Every team for admins; your own otherwise."""
    query = select(Team).order_by(Team.name)
    if not user.is_admin:
        query = query.where(Team.id == user.team_id)
    teams = session.exec(query).all()
    shown, waiting = _sharing(session), _waiting_counts(session)
    return [_public(team, shown, waiting) for team in teams]


@router.patch("/{name}", response_model=TeamPublic, responses=error_responses(403, 404))
def update_team(
    name: str, body: TeamUpdate, _admin: AdminUser, session: SessionDep, settings: SettingsDep
) -> TeamPublic:
    """Set a team's quota or share; waiting jobs that now fit are admitted at once."""
    team = session.exec(select(Team).where(Team.name == name)).first()
    if team is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no team {name!r}")
    fields = body.model_dump(exclude_unset=True)
    if "checkpoint_roots" in fields:
        _check_roots(session, settings, team, fields["checkpoint_roots"])
    if "gpu_borrow_limit" in fields:  # the API's name says GPUs; the column's is shorter
        fields["borrow_limit"] = fields.pop("gpu_borrow_limit")
    for field, value in fields.items():
        setattr(team, field, value)
    session.add(team)
    sharing = settings.scheduling
    profiles = settings.cluster_profiles()
    launches = admit_pending(
        session, profiles, sharing.borrowing, sharing.borrow_backoff_s, sharing.backfill_margin
    )
    session.commit()
    for attempt_id in launches:
        send_or_leave_to_sweep(settings.broker_url, LAUNCH_ATTEMPT, attempt_id)
    return _public(team, _sharing(session), _waiting_counts(session))


@router.get("/{name}/report", response_model=TeamReport, responses=error_responses(403, 404))
def report_team(
    name: str,
    user: CurrentUser,
    session: SessionDep,
    settings: SettingsDep,
    since: Annotated[
        str, Query(max_length=40, description="7d, 12h, 30m back from now, or an ISO 8601 time")
    ] = "7d",
) -> TeamReport:
    """GPU-hours the team's jobs held since then, productive and lost by cause, and their cost
    (your own team; any team for admins)."""
    team = session.exec(select(Team).where(Team.name == name)).first()
    if team is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no team {name!r}")
    if team.id != user.team_id and not user.is_admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="only admins see other teams")
    now = datetime.now(UTC)
    try:
        start = parse_since(since, now)
    except ValueError as exc:  # the 422 shape of every other refused query parameter
        detail = [{"loc": ["query", "since"], "msg": str(exc), "type": "value_error"}]
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=detail) from exc
    return team_report(session, team, start, now, settings.cluster_profiles())


def _check_roots(session: Session, settings: Settings, team: Team, roots: list[str]) -> None:
    others = session.exec(select(Team.name, Team.checkpoint_roots).where(Team.id != team.id))
    if why := roots_conflict(roots, settings.data_dir, dict(others.all())):
        raise body_field_error("checkpoint_roots", why, roots)


def _sharing(session: Session) -> dict[str, TeamSharing]:
    """Nominal, held, borrowed and lent GPUs of every team, read once for every team shown
    (lending needs all of them)."""
    teams = session.exec(select(Team.id, Team.name, Team.gpu_quota)).all()
    usage = held(session, {team_id: name for team_id, name, _quota in teams if team_id})
    return sharing(usage.by_team, {name: quota for _id, name, quota in teams})


def _waiting_counts(session: Session) -> dict[int, int]:
    """PENDING jobs per team id, counted in the database (no job row is loaded)."""
    query = (
        select(Job.team_id, func.count())
        .where(Job.status == JobStatus.PENDING)
        .group_by(col(Job.team_id))
    )
    return {team_id: count for team_id, count in session.exec(query).all()}


def _public(team: Team, shown: dict[str, TeamSharing], waiting: dict[int, int]) -> TeamPublic:
    own = shown[team.name]
    return TeamPublic(
        name=team.name,
        gpu_quota=team.gpu_quota,
        gpu_share=team.gpu_share,
        gpus_held=own.held,
        gpu_borrow_limit=team.borrow_limit,
        gpus_borrowed=own.borrowed,
        gpus_lent=own.lent,
        jobs_waiting=waiting.get(team.id or 0, 0),
        checkpoint_roots=team.checkpoint_roots,
    )
