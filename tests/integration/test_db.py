"""The database layer on SQLite and PostgreSQL.

Migrations, compare-and-set transitions, idempotency, team scoping.
"""

from __future__ import annotations

import threading

import pytest
from sqlmodel import Session, select

from service.core.spec import JobSpec
from service.core.states import AttemptStatus, JobStatus
from service.db import jobs as job_store
from service.db.admission import admit_pending
from service.db.held_gpus import held_everywhere
from service.db.migrate import check, is_at_head
from service.db.models import Job, JobEvent, User
from service.db.new_job import writes_in_one_statement
from service.db.session import autocommit, get_engine
from service.db.transitions import move_attempt, move_job
from service.db.users import Caller, bootstrap_admin, create_user, user_by_token
from tests.integration.helpers import tiny_spec

PLAN = {"zero_stage": 2, "activation_checkpointing": False, "ds_config": {"train_batch_size": 8}}


def make_job(session: Session, user: User, key: str | None = None, name: str = "tiny-gpt") -> Job:
    job, _created = job_store.create_job(
        session,
        spec=JobSpec.model_validate(tiny_spec(name)),
        plan=PLAN,
        advice_reason="test",
        user=user,
        backend="local",
        idempotency_key=key,
    )
    admit_pending(session, {})  # as the API does right after storing it
    session.commit()
    session.refresh(job)
    return job


@pytest.fixture
def user(database_url: str) -> User:
    with Session(get_engine(database_url)) as session:
        token = create_user(session, "alice", "vision")
        session.commit()
        found = user_by_token(session, token)
        assert found is not None
        return found


def test_migrations_match_the_models(database_url: str) -> None:
    assert is_at_head(database_url)
    check(database_url)  # raises when a model change lacks a migration


def test_new_job_is_admitted_with_attempt_one_and_events(database_url: str, user: User) -> None:
    with Session(get_engine(database_url)) as session:
        job = make_job(session, user)
        assert job.status == JobStatus.QUEUED
        attempt = job_store.current_attempt(session, job)
        assert attempt is not None and attempt.number == 1
        assert attempt.status == AttemptStatus.QUEUED
        assert attempt.backend_name == f"zp-tiny-gpt-{job.id[:8]}-a1"
        events = [
            (e.subject, e.from_status, e.to_status) for e in job_store.events_of(session, job.id)
        ]
        assert events == [
            ("job", None, "PENDING"),
            ("attempt", None, "QUEUED"),
            ("job", "PENDING", "QUEUED"),
        ]


def test_compare_and_set_lets_exactly_one_of_two_racers_win(database_url: str, user: User) -> None:
    engine = get_engine(database_url)
    with Session(engine) as session:
        job_id = make_job(session, user).id
    barrier = threading.Barrier(2)
    results: list[bool] = []

    def race(target: JobStatus) -> None:
        with Session(engine) as session:
            job = session.get(Job, job_id)
            assert job is not None
            barrier.wait()
            results.append(move_job(session, job, JobStatus.QUEUED, target, "race"))
            session.commit()

    threads = [
        threading.Thread(target=race, args=(s,)) for s in (JobStatus.LAUNCHING, JobStatus.CANCELLED)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False, True]
    with Session(engine) as session:
        final = session.get(Job, job_id)
        assert final is not None
        moves = session.exec(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.from_status == "QUEUED")
        ).all()
        assert [e.to_status for e in moves] == [final.status]  # one event, for the winner


def test_forbidden_transition_raises_and_writes_nothing(database_url: str, user: User) -> None:
    with Session(get_engine(database_url)) as session:
        job = make_job(session, user)
        before = len(job_store.events_of(session, job.id))
        with pytest.raises(ValueError, match="cannot go from QUEUED to SUCCEEDED"):
            move_job(session, job, JobStatus.QUEUED, JobStatus.SUCCEEDED, "skip ahead")
        attempt = job_store.current_attempt(session, job)
        assert attempt is not None
        assert not move_attempt(session, attempt, AttemptStatus.RUNNING, AttemptStatus.FAILED, "x")
        session.commit()
        assert len(job_store.events_of(session, job.id)) == before
        assert session.get(Job, job.id).status == JobStatus.QUEUED  # type: ignore[union-attr]


def test_idempotency_key_returns_the_same_job(database_url: str, user: User) -> None:
    with Session(get_engine(database_url)) as session:
        first = make_job(session, user, key="retry-1")
        second, created = job_store.create_job(
            session,
            spec=JobSpec.model_validate(tiny_spec()),
            plan=PLAN,
            advice_reason="test",
            user=user,
            backend="local",
            idempotency_key="retry-1",
        )
        assert (second.id, created) == (first.id, False)
        with pytest.raises(job_store.IdempotencyConflict, match=first.id):
            job_store.create_job(
                session,
                spec=JobSpec.model_validate(tiny_spec("other-name")),
                plan=PLAN,
                advice_reason="test",
                user=user,
                backend="local",
                idempotency_key="retry-1",
            )
        assert len(session.exec(select(Job)).all()) == 1


@pytest.mark.parametrize("sessions", ["in a transaction", "as the API's submit opens them"])
def test_a_key_raced_by_concurrent_submits_admits_one_job_and_counts_its_gpus_once(
    database_url: str, user: User, sessions: str
) -> None:
    """Submits admitted as they are stored (no quota, no cap) with the same Idempotency-Key at
    once: one job, and the GPU counter holds its 2 GPUs once (a loser's count is undone). The
    API's submit runs in autocommit where a new job is one statement (PostgreSQL)."""
    spec = JobSpec.model_validate(tiny_spec())  # 1 node x 2 GPUs
    barrier = threading.Barrier(4)
    results: list[bool] = []
    engine = get_engine(database_url)
    if sessions != "in a transaction" and writes_in_one_statement(engine):
        engine = autocommit(engine)

    def submit() -> None:
        with Session(engine) as session:
            barrier.wait()
            stored = job_store.store_job(
                session,
                spec=spec,
                plan=PLAN,
                advice_reason="test",
                caller=Caller(
                    user.id or 0, user.name, False, "member", user.team_id, "vision", None
                ),
                backend="local",
                idempotency_key="raced",
                admitted=True,
            )
            session.commit()
            results.append(isinstance(stored, job_store.NewJob))

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with Session(get_engine(database_url)) as session:
        jobs = session.exec(select(Job)).all()
        assert len(results) == 4 and results.count(True) == 1
        assert [job.status for job in jobs] == [JobStatus.QUEUED]
        assert held_everywhere(session, {user.team_id: "vision"}).by_team == {"vision": 2}
        events = [
            (e.subject, e.from_status, e.to_status)
            for e in job_store.events_of(session, jobs[0].id)
        ]
        assert events == [
            ("job", None, JobStatus.PENDING),
            ("attempt", None, AttemptStatus.QUEUED),
            ("job", JobStatus.PENDING, JobStatus.QUEUED),
        ]


def test_listing_is_team_scoped_newest_first_and_paginated(database_url: str, user: User) -> None:
    with Session(get_engine(database_url)) as session:
        names = [f"job-{i}" for i in range(5)]
        for name in names:
            make_job(session, user, name=name)
        create_user(session, "bob", "speech")
        bob = session.exec(select(User).where(User.name == "bob")).one()
        make_job(session, bob, name="bobs-job")
        page, count = job_store.list_jobs(session, user.team_id, None, limit=2, offset=1)
        assert count == 5
        assert [j.name for j in page] == ["job-3", "job-2"]
        running, zero = job_store.list_jobs(session, user.team_id, JobStatus.RUNNING, 10, 0)
        assert (list(running), zero) == ([], 0)
        assert job_store.get_job(session, page[0].id, bob.team_id) is None


def test_bootstrap_creates_one_admin_only_once(database_url: str) -> None:
    with Session(get_engine(database_url)) as session:
        token = bootstrap_admin(session)
        session.commit()
        assert token is not None and token.startswith("zp_")
        admin = user_by_token(session, token)
        assert admin is not None and admin.is_admin and admin.name == "admin"
        assert admin.token_hash != token  # only the hash is stored
        assert bootstrap_admin(session) is None
