"""When the GPUs a waiting job needs free up under a limit, computed by the database (SQLite
and PostgreSQL): the end of the job whose GPUs make enough, the holding jobs taken in order of
their predicted ends (remaining steps, from their last reported step, at their step time)."""

from __future__ import annotations

from sqlmodel import Session, col, select

from service.core.states import AttemptStatus, JobStatus
from service.db.models import Attempt, Job, MetricPoint, User, new_id
from service.db.placement import start_in_s
from service.db.session import get_engine
from service.db.users import create_user


def holding(session: Session, user: User, gpus: int, steps: int | None, step_s: float | None,
            done: int | None = None, status: JobStatus = JobStatus.RUNNING) -> None:  # fmt: skip
    job = Job(name="held", team_id=user.team_id, user_id=user.id or 0, cluster="c",
              gpus=gpus, spec={}, plan={}, spec_digest="d", status=status, steps=steps,
              step_s=step_s)  # fmt: skip
    session.add(job)
    session.flush()
    if done is not None:  # it has reported steps: what is left is counted from the last
        attempt = Attempt(id=new_id(), job_id=job.id, number=1, plan={}, rung="advisor",
                          backend="local", backend_name=f"a-{job.id}",
                          status=AttemptStatus.RUNNING)  # fmt: skip
        session.add(attempt)
        session.flush()
        session.add_all(MetricPoint(job_id=job.id, attempt_id=attempt.id, step=s)
                        for s in (done - 1, done))  # fmt: skip


def test_a_start_is_the_end_of_the_job_whose_gpus_make_enough(database_url: str) -> None:
    with Session(get_engine(database_url)) as session:
        create_user(session, "alice", "vision")
        user = session.exec(select(User)).one()
        holding(session, user, 4, steps=1000, step_s=1.0, done=400)  # 600 s left
        holding(session, user, 2, steps=120, step_s=0.5)  # 60 s left, none reported yet
        holding(session, user, 8, steps=None, step_s=None)  # no length: end unknown
        holding(session, user, 16, steps=10, step_s=1.0, status=JobStatus.PENDING)  # holds none
        session.commit()
        on_c = col(Job.cluster) == "c"

        assert start_in_s(session, on_c, 0) == 0.0  # free now
        assert start_in_s(session, on_c, 2) == 60.0  # the 2-GPU job ends first
        assert start_in_s(session, on_c, 6) == 600.0
        assert start_in_s(session, on_c, 7) is None  # needs the job whose end is not known
        assert start_in_s(session, on_c, 64) is None  # more than the limit's jobs ever free
        assert start_in_s(session, col(Job.cluster) == "elsewhere", 1) is None
