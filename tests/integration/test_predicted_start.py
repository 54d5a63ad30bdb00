"""Every waiting job's predicted start and end, made by the admission pass from the jobs
holding GPUs (their steps left at the measured step time, else the planned one) and stored on
the job; once it starts, the error of its first prediction (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlmodel import Session, select

from service.core.backfill import Margin
from service.core.clusters import LOCAL_PROFILE
from service.core.states import JobStatus
from service.db.admission import admit_pending
from service.db.jobs import current_attempt
from service.db.models import Attempt, Job, JobEvent, MetricPoint, User, as_utc, new_id, utcnow
from service.db.session import get_engine
from service.db.transitions import move_job
from service.db.users import create_user

CAPPED = {"c": LOCAL_PROFILE.model_copy(update={"name": "c", "max_gpus": 4})}
EXACT = 0.001  # seconds: the stored times keep microseconds; the arithmetic is exact to them


def store(session: Session, user: User, name: str, gpus: int, steps: int, step_s: float) -> Job:
    job = Job(id=new_id(), name=name, team_id=user.team_id, user_id=user.id or 0, cluster="c",
              gpus=gpus, spec={"resources": {"nodes": 1, "gpus_per_node": gpus}}, plan={},
              spec_digest="d", steps=steps, step_s=step_s,
              current_attempt=1)  # fmt: skip
    session.add(job)
    session.flush()  # the attempt's foreign key needs it
    session.add(Attempt(id=new_id(), job_id=job.id, number=1, plan={}, rung="advisor",
                        backend="local", backend_name=f"a-{job.id}"))  # fmt: skip
    session.flush()
    return job


def reported(session: Session, job: Job, *steps: tuple[int, datetime]) -> None:
    attempt = current_attempt(session, job)
    assert attempt is not None
    session.add_all(MetricPoint(job_id=job.id, attempt_id=attempt.id, step=step, created_at=at)
                    for step, at in steps)  # fmt: skip


def seconds(moment: datetime | None, since: datetime) -> float:
    assert moment is not None
    return (as_utc(moment) - since).total_seconds()


def test_waiting_jobs_are_predicted_from_the_running_jobs_steps_and_the_error_is_kept(
    database_url: str,
) -> None:
    t0 = utcnow()
    with Session(get_engine(database_url)) as session:
        create_user(session, "alice", "vision")
        user = session.exec(select(User)).one()
        measured = store(session, user, "measured", 2, steps=100, step_s=1.0)
        planned = store(session, user, "planned", 2, steps=1000, step_s=0.5)
        admit_pending(session, CAPPED)  # both start: the cap's 4 GPUs are held
        # Steps 10 and 50 reported 80 s apart: 2 s a step measured; 50 left end at t0 + 90 s.
        reported(
            session, measured, (10, t0 - timedelta(seconds=90)), (50, t0 - timedelta(seconds=10))
        )
        started = current_attempt(session, planned)
        assert started is not None
        started.started_at = t0 - timedelta(seconds=100)  # no report yet: 1000 x 0.5 s from it
        whole = store(session, user, "whole-cap", 4, steps=60, step_s=1.0)
        after = store(session, user, "after-it", 2, steps=10, step_s=1.0)
        session.commit()

        admit_pending(session, CAPPED)
        session.commit()
        session.refresh(whole)
        session.refresh(after)

        # The 4-GPU job needs both holders' GPUs: the planned job ends at t0 + 400 s.
        assert seconds(whole.predicted_start_at, t0) == pytest.approx(400, abs=EXACT)
        assert seconds(whole.predicted_end_at, t0) == pytest.approx(460, abs=EXACT)
        assert whole.prediction_basis == (
            f"start: cluster c's 4-GPU cap frees enough when job {planned.id} ends (1000 steps"
            " left at 0.5 s (planned)); run: 60 steps at 1 s (planned)"
        )
        assert seconds(after.predicted_start_at, t0) == pytest.approx(460, abs=EXACT)
        assert seconds(after.predicted_end_at, t0) == pytest.approx(470, abs=EXACT)
        assert whole.status == after.status == JobStatus.PENDING

        for job in (measured, planned):  # both end now, long before they were predicted to
            move_job(session, job, JobStatus.QUEUED, JobStatus.CANCELLED, "ended")
        admit_pending(session, CAPPED)
        session.commit()
        session.refresh(whole)

    assert whole.status == JobStatus.QUEUED
    error = whole.start_prediction_error_s
    admitted_at = as_utc(whole.updated_at)
    assert error == pytest.approx(seconds(admitted_at, t0) - 400, abs=0.05)
    assert -400 < error < -390  # started about 400 s before its first predicted start


def test_the_pass_backfills_a_short_job_and_the_others_say_why_they_wait(
    database_url: str,
) -> None:
    capped = {"c": LOCAL_PROFILE.model_copy(update={"name": "c", "max_gpus": 2})}
    with Session(get_engine(database_url)) as session:
        create_user(session, "alice", "vision")
        user = session.exec(select(User)).one()
        holder = store(session, user, "holder", 1, steps=100, step_s=1.0)  # 100 s from now
        admit_pending(session, capped)
        big = store(session, user, "big", 2, steps=10, step_s=1.0)
        long = store(session, user, "long", 1, steps=1000, step_s=1.0)
        short = store(session, user, "short", 1, steps=10, step_s=1.0)
        session.commit()

        admit_pending(session, capped)  # backfill off: everyone waits behind the big job
        assert short.status == JobStatus.PENDING
        admit_pending(session, capped, backfill_margin=Margin(floor_s=5.0, share=0.25))
        session.commit()
        events = session.exec(select(JobEvent).where(JobEvent.job_id == short.id)).all()
        for job in (holder, big, long, short):
            session.refresh(job)

    assert (big.status, long.status, short.status) == ("PENDING", "PENDING", "QUEUED")
    reason = next(e.reason for e in events if e.subject == "job" and e.to_status == "QUEUED")
    assert reason.startswith("admitted; backfilled: predicted to end by ")  # 10 s + 5 s margin
    assert f"before job {big.id}'s reserved start at " in reason
    assert big.message == "waiting: cluster c has 2 of its 2 GPUs admitted; this job needs 2"
    assert long.message == "waiting: behind an earlier job waiting for cluster c"
    holder_ends = as_utc(holder.updated_at) + timedelta(seconds=100)  # no report: from now
    assert seconds(big.predicted_start_at, holder_ends) == pytest.approx(0, abs=1.0)
