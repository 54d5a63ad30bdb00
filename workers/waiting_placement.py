"""Re-placing waiting ``cluster: auto`` jobs when another cluster becomes the better choice.

The reconcile pass calls it after admission, inside the admission turn, so no decision races
it. It looks at the first few waiting jobs in admission order (``replace_per_pass``) that were
placed more than the settling time ago, plans each for every cluster it may run on with the
admission state as it is now (``service.db.placing``), and moves the ones that end clearly
earlier elsewhere, or can no longer run where they wait (``service.core.waiting_placement``).
Jobs placed by cost stay: a price does not change with a queue. A job that ever started stays
too: it moves only after a failed launch, between clusters that share its checkpoints
(``workers.replacement``).
"""

from __future__ import annotations

import logging

from sqlmodel import Session

from service.core.clusters import ClusterProfile
from service.core.placement import summary
from service.core.spec import JobSpec
from service.core.states import AttemptStatus
from service.core.waiting_placement import Hysteresis, move_to, moved_words, settled_since
from service.db.admission import WAITING_PREFIX
from service.db.attempts import failed_launch_clusters
from service.db.jobs import attempts_of
from service.db.models import Job, Team, User, utcnow
from service.db.placement import move_waiting_job, waiting_auto_jobs
from service.db.placing import Moving, place
from service.db.users import Caller
from service.settings import Settings

log = logging.getLogger(__name__)


def replace_waiting(session: Session, settings: Settings) -> int:
    """Move the waiting auto jobs a better cluster now suits; how many moved."""
    sharing = settings.scheduling
    if sharing.replace_per_pass == 0:
        return 0
    rule = sharing.hysteresis
    jobs = waiting_auto_jobs(session, settled_since(utcnow(), rule), sharing.replace_per_pass)
    if not jobs:
        return 0
    profiles = settings.cluster_profiles()
    return sum(_re_place(session, settings, profiles, job, rule) for job in jobs)


def _re_place(
    session: Session,
    settings: Settings,
    profiles: dict[str, ClusterProfile],
    job: Job,
    rule: Hysteresis,
) -> bool:
    spec = JobSpec.model_validate(job.spec)
    attempts = attempts_of(session, job.id)
    attempt = next((a for a in attempts if a.number == job.current_attempt), None)
    user, team = session.get(User, job.user_id), session.get(Team, job.team_id)
    if (
        spec.resources.placement != "time"
        or any(a.started_at is not None for a in attempts)
        or attempt is None
        or attempt.status != AttemptStatus.QUEUED
        or user is None
        or team is None
    ):
        return False
    failed = frozenset(failed_launch_clusters(attempts))
    waits_here = job.message.removeprefix(WAITING_PREFIX) or "waiting for admission"
    moving = Moving(job.id, job.cluster, failed, waits_here=waits_here)
    placed = place(session, spec, profiles, Caller.of(user, team),
                   borrowing=settings.scheduling.borrowing, moving=moving)  # fmt: skip
    here = next((o for o in placed.options if o.cluster == job.cluster), None)
    there = move_to(here, placed.options, rule) if here is not None else None
    if here is None or there is None or there.advice is None:
        return False
    plan = there.advice.plan
    why = moved_words(here, there)
    moved = move_waiting_job(
        session, job, attempt, to=there.cluster, backend=profiles[there.cluster].kind,
        plan=plan.model_dump(mode="json"),
        step_s=spec.training.step_seconds(plan.tokens_per_second),
        advice_reason=f"{summary(placed.options, there)}. {there.advice.reason}",
        reason=f"{why}; {summary(placed.options, there)}",
    )  # fmt: skip
    if moved:
        log.info("job %s %s", job.id, why)
    return moved
