"""Launching one attempt: claim it, render its files, submit it, record the backend reference.

Safe to run twice for the same attempt (a redelivered task, a sweep after a worker died): the
claim is a compare-and-set, the rendered files are written once, and ``submit`` is idempotent
by the attempt's deterministic backend name.

A failed try is counted on the attempt (``launch_tries``, whoever sent the task: a retry or the
sweep), so every launch error ends the attempt as ``LAUNCH_ERROR`` after
``workers.launch_max_tries``; a ``PermanentError`` ends it at once. Each try logs one line.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from sqlalchemy import update
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col

from service.checkpoint_paths import checkpoint_dir, job_fence
from service.core.cadence import launch_steps, resolve_setting
from service.core.clusters import ClusterProfile
from service.core.spec import JobSpec
from service.core.states import AttemptStatus, JobStatus
from service.core.stopping import stop_grace
from service.db.models import Attempt, Job, utcnow
from service.db.session import session_scope
from service.db.transitions import move_attempt, move_job
from service.db.users import checkpoint_roots_of
from service.logs import job_id as current_job_id
from service.metrics import ATTEMPTS_LAUNCHED
from service.security import attempt_token
from service.settings import Settings
from workers.backends import get_backend
from workers.backends.base import LaunchRequest, PermanentError, TemporaryError
from workers.outcomes import launch_failed
from workers.render import make_private_dir, write_json_once
from zeropilot.resume import ResumeMethod

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 500  # a 1 MB path in an error must not reach every log line and message


def launch_attempt(settings: Settings, attempt_id: str) -> float | None:
    """Launch the attempt; return the seconds to wait before trying again after a failed try,
    or None when nothing is left to do (launched, failed for good, or not this task's to do)."""
    try:
        _launch(settings, attempt_id)
    except SQLAlchemyError:
        raise  # the database, not the launch: the sweep sends it again once it is back
    except PermanentError as exc:
        _fail_launch(settings, attempt_id, describe_error(exc))
    except Exception as exc:  # every other launch error is retried, a bounded number of times
        asked = exc.delay_s if isinstance(exc, TemporaryError) else 0.0
        return _count_failed_try(settings, attempt_id, describe_error(exc), asked)
    return None


def _launch(settings: Settings, attempt_id: str) -> None:
    with session_scope(settings.database_url) as session:
        claimed = _claim(session, attempt_id)
        if claimed is None:
            return
        session.commit()  # the claim holds even when rendering below fails
        job, attempt = claimed
        current_job_id.set(job.id)  # on this task's log lines
        profile = settings.cluster_profiles()[job.cluster]
        _check_resume_point(session, settings, job, attempt)
        request = build_request(settings, job, attempt, profile)
    backend = get_backend(profile.kind)
    _pause(settings.workers.fault_pause_before_submit_s)
    ref = backend.submit(request)
    ATTEMPTS_LAUNCHED.labels(profile.name, profile.kind).inc()
    log.info("attempt %s submitted to %s as %s", attempt_id, profile.name, ref)
    _pause(settings.workers.fault_pause_after_submit_s)
    if _record_ref(settings, attempt_id, ref, backend.log_path(ref, request)):
        backend.cancel(profile, ref)  # cancelled while we were submitting


def describe_error(exc: Exception) -> str:
    """One line naming the error, short enough for a log line and the job's message."""
    text = " ".join(str(exc).split())
    if not isinstance(exc, PermanentError | TemporaryError):  # backend errors are sentences
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "\u2026"


def _count_failed_try(
    settings: Settings, attempt_id: str, error: str, asked_s: float = 0.0
) -> float | None:
    """Record one failed try; end the attempt after the last, else return the wait: the
    back-off, or longer where the cluster asked for it (``asked_s``), never past the lease."""
    with session_scope(settings.database_url) as session:
        attempt = session.get(Attempt, attempt_id, with_for_update=True)
        if attempt is None or attempt.status != AttemptStatus.LAUNCHING:
            return None
        tries = attempt.launch_tries + 1
        attempt.launch_tries, attempt.launch_error = tries, error
        session.add(attempt)
    workers = settings.workers
    if tries >= workers.launch_max_tries:
        _fail_launch(settings, attempt_id, f"{error} (launch tried {tries} times)")
        return None
    backoff = workers.launch_retry_delay_s * 2 ** (tries - 1)
    delay: float = min(max(backoff, asked_s), workers.launch_lease_s)
    log.warning(
        "launch of attempt %s failed (try %d of %d), next try in %.0f s: %s",
        attempt_id,
        tries,
        workers.launch_max_tries,
        delay,
        error,
    )
    return delay


def _claim(session: Session, attempt_id: str) -> tuple[Job, Attempt] | None:
    """Move job and attempt to LAUNCHING, or confirm a launch that a dead worker began."""
    attempt = session.get(Attempt, attempt_id)
    job = session.get(Job, attempt.job_id) if attempt else None
    if attempt is None or job is None or job.current_attempt != attempt.number:
        return None
    reason = f"attempt {attempt.number} launching on {job.cluster}"
    if job.status == JobStatus.QUEUED and attempt.status == AttemptStatus.QUEUED:
        if not move_job(session, job, JobStatus.QUEUED, JobStatus.LAUNCHING, reason):
            return None
        move_attempt(session, attempt, AttemptStatus.QUEUED, AttemptStatus.LAUNCHING, reason)
        return job, attempt
    if job.status == JobStatus.LAUNCHING and attempt.status == AttemptStatus.LAUNCHING:
        _touch(session, attempt)  # a retry of an interrupted launch: submit finds what exists
        return job, attempt
    return None  # launched already, finished, or cancelled


def _check_resume_point(session: Session, settings: Settings, job: Job, attempt: Attempt) -> None:
    """A checkpoint checked when it was reported may have become a link elsewhere since."""
    if not attempt.resumed_from:
        return
    fence = job_fence(
        settings.data_dir, job.id, job.spec, checkpoint_roots_of(session, job.team_id)
    )
    if fence is None or not fence.holds(attempt.resumed_from):
        folder = fence.folder if fence else checkpoint_dir(settings.data_dir, job.id, job.spec)
        raise PermanentError(
            f"the checkpoint to resume from, {attempt.resumed_from}, no longer lies inside the"
            f" job's checkpoint folder {folder}: not resumed from it"
        )


def build_request(
    settings: Settings, job: Job, attempt: Attempt, profile: ClusterProfile
) -> LaunchRequest:
    spec = JobSpec.model_validate(job.spec)
    make_private_dir(settings.attempts_dir)
    attempt_dir = make_private_dir(settings.attempts_dir / attempt.backend_name)
    ds_config_path = attempt_dir / "ds_config.json"
    write_json_once(ds_config_path, attempt.plan["ds_config"])
    checkpoints = checkpoint_dir(settings.data_dir, job.id, job.spec)
    env = {
        **spec.env,
        "ZEROPILOT_URL": settings.public_url,
        "ZEROPILOT_JOB_ID": job.id,
        "ZEROPILOT_ATTEMPT": str(attempt.number),
        "ZEROPILOT_ATTEMPT_ID": attempt.id,
        "ZEROPILOT_ATTEMPT_TOKEN": attempt_token(settings.secret_key(), attempt.id),
        "ZEROPILOT_CHECKPOINT_DIR": checkpoints,
        "ZEROPILOT_CHECKPOINT_INTERVAL": str(_first_interval(spec, job, profile)),
        "ZEROPILOT_DS_CONFIG": str(ds_config_path),
        "ZEROPILOT_ACTIVATION_CHECKPOINTING": "1"
        if attempt.plan["activation_checkpointing"]
        else "0",
    }
    if attempt.resumed_from:
        env["ZEROPILOT_RESUME_FROM"] = attempt.resumed_from
        env["ZEROPILOT_RESUME_METHOD"] = attempt.resume_method or ResumeMethod.NATIVE
    minutes = spec.resources.time_limit_minutes
    grace_s = stop_grace(spec.checkpoint.grace_s, [], settings.workers.stop_grace_s).seconds
    return LaunchRequest(
        name=attempt.backend_name,
        attempt_dir=attempt_dir,
        nodes=spec.resources.nodes,
        procs_per_node=spec.resources.gpus_per_node,
        entrypoint=spec.entrypoint,
        args=tuple(spec.args),
        ds_config_path=ds_config_path,
        env=env,
        working_dir=Path(spec.working_dir or settings.data_dir),
        profile=profile,
        image=spec.image,
        time_limit_s=minutes * 60 if minutes else None,
        python=settings.workers.python or sys.executable,
        stop_grace_s=grace_s,
    )


def _first_interval(spec: JobSpec, job: Job, profile: ClusterProfile) -> int:
    """The steps between saves the attempt starts with; with ``auto`` its first metrics
    report's answer gives the interval from measurements (service.db.cadence)."""
    setting = resolve_setting(spec.checkpoint.interval_steps, profile)
    return launch_steps(setting, job.step_s, job.steps)


def _record_ref(settings: Settings, attempt_id: str, ref: str, log_path: str | None) -> bool:
    """Store the backend reference; return True when the job was cancelled meanwhile."""
    with session_scope(settings.database_url) as session:
        session.execute(
            update(Attempt)
            .where(col(Attempt.id) == attempt_id)
            .values(backend_ref=ref, log_path=log_path)
        )
        attempt = session.get(Attempt, attempt_id)
        job = session.get(Job, attempt.job_id) if attempt else None
        return job is not None and job.status == JobStatus.CANCELLED


def _fail_launch(settings: Settings, attempt_id: str, message: str) -> None:
    log.warning("launch of attempt %s failed: %s", attempt_id, message)
    with session_scope(settings.database_url) as session:
        attempt = session.get(Attempt, attempt_id)
        job = session.get(Job, attempt.job_id) if attempt else None
        if attempt is not None and job is not None:  # what follows is service.core.outcomes'
            launch_failed(session, settings, job, attempt, message)


def _touch(session: Session, attempt: Attempt) -> None:
    session.execute(update(Job).where(col(Job.id) == attempt.job_id).values(updated_at=utcnow()))


def _pause(seconds: float) -> None:
    if seconds > 0:
        log.warning("fault injection: pausing %.1f s in the launch", seconds)
        time.sleep(seconds)
