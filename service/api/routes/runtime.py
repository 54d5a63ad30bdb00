"""Reports from inside training processes, authenticated by the per-attempt runtime token."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from service.api.deps import ReportingAttempt, SessionDep, SettingsDep
from service.api.errors import body_field_error, error_responses
from service.api.schemas import (
    CheckpointReport,
    DeviceReport,
    FailureReport,
    MetricReport,
    MetricReports,
    MetricsAnswer,
)
from service.checkpoint_paths import configured_dir, job_fence
from service.db import jobs as job_store
from service.db.cadence import refresh_interval, stored_interval
from service.db.models import Job
from service.db.transitions import note_attempt
from service.db.users import checkpoint_roots_of
from service.tasks import ATTEMPT_ENDED, send_or_leave_to_sweep

# Enough for a checkpoint every 100 steps of 100,000; bounds the job's detail (4 KiB paths).
MAX_CHECKPOINTS_PER_ATTEMPT = 1000

router = APIRouter(
    prefix="/v1/runtime/attempts/{attempt_id}",
    tags=["runtime"],
    responses=error_responses(401, 404),
)


@router.post("/metrics", status_code=status.HTTP_204_NO_CONTENT)
def report_metrics(report: MetricReport, attempt: ReportingAttempt, session: SessionDep) -> None:
    job_store.record_metric(session, attempt, report.model_dump())
    session.commit()


@router.post("/metrics/batch", response_model=MetricsAnswer)
def report_metric_batch(
    reports: MetricReports, attempt: ReportingAttempt, session: SessionDep, settings: SettingsDep
) -> MetricsAnswer:
    """Several steps' metrics at once, in one transaction (the runtime sends a second's worth:
    a job stepping ten times a second costs the API one request a second, not ten). The answer
    carries the interval the attempt should save at now, which the runtime follows."""
    for report in reports.root:
        job_store.record_metric(session, attempt, report.model_dump())
    interval = stored_interval(attempt)
    if interval is None:  # its first report: the interval from what is known so far
        interval = refresh_interval(session, attempt, settings.cluster_profiles())
    session.commit()
    return MetricsAnswer(checkpoint_interval_steps=interval)


@router.post("/checkpoints", status_code=status.HTTP_204_NO_CONTENT, responses=error_responses(409))
def report_checkpoint(
    report: CheckpointReport, attempt: ReportingAttempt, session: SessionDep, settings: SettingsDep
) -> None:
    job = session.get(Job, attempt.job_id)
    spec = job.spec if job else {}
    roots = checkpoint_roots_of(session, job.team_id) if job else []
    fence = job_fence(settings.data_dir, attempt.job_id, spec, roots)
    if fence is None or not fence.holds(report.path):  # elsewhere could be anyone's files
        folder = fence.folder if fence else configured_dir(settings.data_dir, spec)
        why = f"must lie inside the attempt's checkpoint folder {folder}"
        if fence is None:
            why += ", which is no longer inside a checkpoint root of the job's team"
        raise body_field_error("path", why, report.path)
    if job_store.count_checkpoints(session, attempt) >= MAX_CHECKPOINTS_PER_ATTEMPT:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            detail=f"attempt {attempt.number} already reported {MAX_CHECKPOINTS_PER_ATTEMPT}"
            " checkpoints, the most one attempt may record",
        )
    job_store.record_checkpoint(
        session, attempt, report.step, report.path, report.tag, report.seconds
    )
    refresh_interval(session, attempt, settings.cluster_profiles())  # a save measured: re-weigh
    session.commit()


@router.post("/device", status_code=status.HTTP_204_NO_CONTENT)
def report_device(report: DeviceReport, attempt: ReportingAttempt, session: SessionDep) -> None:
    """A rank's device memory as training starts: whether others held the device is evidence."""
    session.refresh(attempt, with_for_update=True)  # ranks report at once: no lost update
    devices = dict(attempt.runtime_evidence.get("devices", {}))
    devices[str(report.rank)] = report.model_dump(exclude={"rank"})
    attempt.runtime_evidence = {**attempt.runtime_evidence, "devices": devices}  # a new dict: JSON
    session.add(attempt)
    session.commit()


@router.post("/ended", status_code=status.HTTP_202_ACCEPTED)
def report_ended(attempt: ReportingAttempt, session: SessionDep, settings: SettingsDep) -> None:
    """The attempt's processes have ended (its supervisor says so as they exit): a worker
    records the end now instead of at its next pass. Asked once per attempt; a repeat is
    accepted and sends nothing, so a job cannot flood the workers or its cluster with polls."""
    session.refresh(attempt, with_for_update=True)
    if attempt.runtime_evidence.get("ended_reported"):
        return
    attempt.runtime_evidence = {**attempt.runtime_evidence, "ended_reported": True}
    session.add(attempt)
    session.commit()
    send_or_leave_to_sweep(settings.broker_url, ATTEMPT_ENDED, attempt.id)


@router.post("/failure", status_code=status.HTTP_204_NO_CONTENT)
def report_failure(report: FailureReport, attempt: ReportingAttempt, session: SessionDep) -> None:
    """The training process caught its own failure (e.g. an allocator OOM) before exiting."""
    session.refresh(attempt, with_for_update=True)
    attempt.runtime_failure_tag = report.failure_class
    attempt.failure_message = report.message
    if "failure" not in attempt.runtime_evidence:  # the first rank to fail is the one that counts
        failure = {"message": report.message, "numbers": report.evidence}
        attempt.runtime_evidence = {**attempt.runtime_evidence, "failure": failure}
    session.add(attempt)
    note_attempt(
        session, attempt, f"training reported {report.failure_class}: {report.message[:200]}"
    )
    session.commit()
