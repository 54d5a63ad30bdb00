"""Checkpoint retention during the run.

Each reconcile tick looks for checkpoints no pass has checked yet (a new report). For each job
with one it checks every checkpoint it still keeps on disk (``service.checkpoint_files``: every
rank's files, the Trainer's state written last, no link followed), asks
``service.core.retention`` which to delete, deletes them and records each deletion as a job
event with its size. The job row is locked meanwhile, so two workers never decide at once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlmodel import Session, col, select

from service import checkpoint_files
from service.checkpoint_paths import Fence, job_fence
from service.contained_files import NotContained
from service.core.advisor.models import format_bytes
from service.core.retention import Retention, Saved, metric_at, to_delete
from service.core.spec import JobSpec
from service.db.jobs import attempts_of, kept_checkpoints
from service.db.models import Attempt, Checkpoint, Job, JobEvent, MetricPoint, Team, utcnow
from service.db.session import session_scope
from service.db.users import checkpoint_roots_of
from service.metrics import CHECKPOINT_BYTES_DELETED, JOB_CHECKPOINT_BYTES
from service.settings import Settings

log = logging.getLogger(__name__)

STORAGE_SUBJECT = "storage"  # a job event that is not a status change: a deletion


def jobs_with_unchecked_checkpoints(settings: Settings) -> list[str]:
    with session_scope(settings.database_url) as session:
        query = select(Checkpoint.job_id).where(
            col(Checkpoint.checked_at).is_(None), col(Checkpoint.deleted_at).is_(None)
        )
        return sorted(set(session.exec(query).all()))


def retain(settings: Settings, job_id: str) -> list[str]:
    """One retention pass over the job's checkpoints; the paths it deleted."""
    with session_scope(settings.database_url) as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None:
            return []
        fence = _fence(session, settings, job)
        rows = kept_checkpoints(session, job.id)
        if fence is None or not rows:
            _mark_checked(rows)
            return []
        attempts = {a.id: a for a in attempts_of(session, job.id)}
        spec = JobSpec.model_validate(job.spec)
        check_all(fence, rows, attempts, spec)
        policy = policy_of(spec)
        saved = [_saved(session, row, policy) for row in rows]
        pinned = [a.resumed_from for a in attempts.values() if a.resumed_from]
        doomed = to_delete(saved, policy, pinned)
        deleted = [
            r for r in rows if r.id in doomed and _delete(session, fence, job, r, doomed[r.id])
        ]
        kept = sum(r.size_bytes or 0 for r in rows if r not in deleted)
        JOB_CHECKPOINT_BYTES.labels(job.id, _team_name(session, job)).set(kept)
        return [row.path for row in deleted]


def policy_of(spec: JobSpec) -> Retention:
    checkpoint = spec.checkpoint
    best = checkpoint.keep_best
    return Retention(
        keep_last=checkpoint.keep_last,
        keep_every_steps=checkpoint.keep_every_steps,
        best_metric=best.metric if best else None,
        best_mode=best.mode if best else "min",
    )


def check_all(
    fence: Fence, rows: Sequence[Checkpoint], attempts: dict[str, Attempt], spec: JobSpec
) -> None:
    """Look at each checkpoint on disk now: a checked one may have lost files since."""
    for row in rows:
        attempt = attempts.get(row.attempt_id)
        stage = int(attempt.plan.get("zero_stage", 0)) if attempt else 0
        found = checkpoint_files.inspect(fence, row.path, stage, spec.resources.world_size)
        row.complete, row.size_bytes, row.checked_at = found.complete, found.size_bytes, utcnow()
        if not found.complete:
            log.info("checkpoint %s is incomplete: %s", row.path, found.why)


def _saved(session: Session, row: Checkpoint, policy: Retention) -> Saved:
    metric = None
    if policy.best_metric:
        query = select(MetricPoint).where(
            MetricPoint.attempt_id == row.attempt_id, MetricPoint.step == row.step
        )
        point = session.exec(query).first()
        if point is not None:
            values = {"loss": point.loss, "tokens_per_s": point.tokens_per_s, **point.extra}
            metric = metric_at(values, policy.best_metric)
    return Saved(row.id or 0, row.step, row.path, bool(row.complete), metric)


def _delete(session: Session, fence: Fence, job: Job, row: Checkpoint, why: str) -> bool:
    size = row.size_bytes or 0
    try:
        checkpoint_files.delete(fence, row.path)
        what = f"deleted the step-{row.step} checkpoint {row.path} ({format_bytes(size)}): {why}"
    except FileNotFoundError:
        what = f"the step-{row.step} checkpoint {row.path} was already gone: {why}"
        size = 0
    except (NotContained, OSError) as exc:
        log.warning("checkpoint %s not deleted: %s", row.path, exc)
        return False
    row.deleted_at = utcnow()
    session.add(row)
    session.add(
        JobEvent(
            job_id=job.id,
            subject=STORAGE_SUBJECT,
            to_status="DELETED",
            reason=what,
        )
    )
    CHECKPOINT_BYTES_DELETED.labels(job.cluster).inc(size)
    return True


def _fence(session: Session, settings: Settings, job: Job) -> Fence | None:
    return job_fence(settings.data_dir, job.id, job.spec, checkpoint_roots_of(session, job.team_id))


def _team_name(session: Session, job: Job) -> str:
    team = session.get(Team, job.team_id)
    return team.name if team else ""


def _mark_checked(rows: Sequence[Checkpoint]) -> None:
    for row in rows:
        row.checked_at = utcnow()
