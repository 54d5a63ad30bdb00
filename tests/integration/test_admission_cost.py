"""A submit costs the database the same with 10 or 1,000 jobs already stored, and reading
waiting jobs never loads their specs.

Counted, not timed: the SQL statements one POST /v1/jobs sends and the rows they return, at the
driver's cursor (which both the ORM and ``service.db.plain`` use), on PostgreSQL, once with 10
jobs stored and again with 1,000. Admission per submit reads counters and indexed "is anything
waiting here?" probes; only the workers' periodic pass scans, and it, the queue, the teams and
job lists read the columns they show or order by, not a spec or plan of up to a megabyte
(``bench/big_specs.py`` times them beside another team's big specs).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import event
from sqlmodel import Session, select

from service.api.app import create_app
from service.core.advisor import advise
from service.core.clusters import LOCAL_PROFILE, ClusterProfile
from service.core.spec import JobSpec
from service.db import calibrations, plain
from service.db.admission import admit_pending
from service.db.jobs import spec_digest
from service.db.migrate import upgrade
from service.db.models import Job, Team, User
from service.db.session import get_engine
from service.settings import (
    AuthSettings,
    BrokerSettings,
    ClusterSettings,
    DatabaseSettings,
    Settings,
)
from tests.integration.helpers import auth, three_users, tiny_spec


@dataclass
class Cost:
    statements: int = 0
    rows: int = 0


@pytest.fixture
def pg_settings(postgres_url: str, redis_url: str, tmp_path: Path) -> Settings:
    upgrade(postgres_url)
    return Settings(
        data_dir=tmp_path / "data",
        db=DatabaseSettings(url=postgres_url),
        broker=BrokerSettings(url=redis_url),
        auth=AuthSettings(secret_key="test-secret-key"),
    )


@pytest.fixture(autouse=True)
def _calibration_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process reads a cluster's calibration again after ``REFRESH_S`` (5 s); storing a
    backlog of 1,000 jobs takes longer, and these tests count what the backlog costs."""
    monkeypatch.setattr(calibrations, "REFRESH_S", 3600.0)


@pytest.fixture
def client(pg_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(pg_settings)) as test_client:
        yield test_client


def store_jobs(
    database_url: str,
    user_name: str,
    count: int,
    admit: bool,
    profile: ClusterProfile = LOCAL_PROFILE,
    steps: int | None = None,
) -> None:
    """``count`` more jobs of the user on ``profile`` (rows only, one batch), admitted by the
    periodic pass (QUEUED, holding GPUs) or left PENDING; with ``steps``, of a known length."""
    spec = JobSpec.model_validate(tiny_spec("backlog"))
    plan = advise(spec, profile).plan.model_dump(mode="json")
    with Session(get_engine(database_url)) as session:
        user = session.exec(select(User).where(User.name == user_name)).one()
        session.add_all(
            Job(name=spec.name, team_id=user.team_id, user_id=user.id or 0, cluster=profile.name,
                gpus=spec.resources.world_size, spec=spec.model_dump(mode="json"), plan=plan,
                spec_digest=spec_digest(spec), steps=steps, step_s=0.5 if steps else None)
            for _ in range(count)
        )  # fmt: skip
        session.flush()
        if admit:
            admit_pending(session, {profile.name: profile})
        session.commit()


def set_quota(database_url: str, team_name: str, gpus: int) -> None:
    with Session(get_engine(database_url)) as session:
        team = session.exec(select(Team).where(Team.name == team_name)).one()
        team.gpu_quota = gpus
        session.add(team)
        session.commit()


def counted_submit(
    client: TestClient,
    database_url: str,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    spec: dict[str, Any] | None = None,
) -> tuple[Cost, Any]:
    """Submit one job and count what it asked of the database, at the driver: statements sent
    through the ORM (the connection's cursors) and those the hot path sends on psycopg's
    RawCursor (``service.db.plain``)."""
    cost = Cost()

    def counted(execute: Any) -> Any:
        def run(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
            cost.statements += 1
            done = execute(self, query, params, **kwargs)
            if self.description is not None:  # a statement that returns rows
                cost.rows += max(self.rowcount, 0)
            return done

        return run

    class CountingCursor(psycopg.Cursor[Any]):
        execute = counted(psycopg.Cursor.execute)

    class CountingRawCursor(psycopg.RawCursor[Any]):
        execute = counted(psycopg.RawCursor.execute)

    counting: list[psycopg.Connection[Any]] = []

    def count_on(dbapi_connection: Any, *_: Any) -> None:
        dbapi_connection.cursor_factory = CountingCursor
        counting.append(dbapi_connection)

    engine = get_engine(database_url)
    event.listen(engine, "checkout", count_on)
    with monkeypatch.context() as patch:
        patch.setattr(plain, "RawCursor", CountingRawCursor)
        try:
            response = client.post(
                "/v1/jobs", json=spec or tiny_spec("measured"), headers=auth(token)
            )
        finally:
            event.remove(engine, "checkout", count_on)
            for connection in counting:  # back in the pool: count nothing else
                connection.cursor_factory = psycopg.Cursor
    assert response.status_code == 201, response.text
    assert cost.statements > 0, "nothing counted: the cursor factory was not used"
    return cost, response.json()


def test_an_admitted_submit_costs_the_same_beside_10_or_1000_admitted_jobs(
    client: TestClient, pg_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = pg_settings.database_url
    tokens = three_users(url)
    store_jobs(url, "bob", 10, admit=True)
    counted_submit(client, url, tokens["root"], monkeypatch)  # warm: connections, the first queries

    small, first = counted_submit(client, url, tokens["alice"], monkeypatch)
    store_jobs(url, "bob", 990, admit=True)
    large, second = counted_submit(client, url, tokens["alice"], monkeypatch)

    assert first["status"] == second["status"] == "QUEUED"
    assert (large.statements, large.rows) == (small.statements, small.rows)
    # The caller, then the job, attempt, events and GPU counter in one statement that returns
    # the three events' ids.
    assert (small.statements, small.rows) == (2, 4)


def test_a_waiting_submit_costs_the_same_behind_10_or_1000_waiting_jobs(
    client: TestClient, pg_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = pg_settings.database_url
    tokens = three_users(url)
    set_quota(url, "vision", 8)
    store_jobs(url, "alice", 10, admit=False)  # waiting for the periodic pass
    store_jobs(url, "bob", 10, admit=False)
    counted_submit(client, url, tokens["root"], monkeypatch)

    small, first = counted_submit(client, url, tokens["alice"], monkeypatch)
    store_jobs(url, "alice", 990, admit=False)
    store_jobs(url, "bob", 990, admit=False)
    large, second = counted_submit(client, url, tokens["alice"], monkeypatch)

    assert first["status"] == second["status"] == "PENDING"
    assert second["message"] == (
        "waiting: other jobs of team vision wait too; the next admission pass orders them"
    )
    assert (large.statements, large.rows) == (small.statements, small.rows)


CPU = {"kind": "local", "gpus_per_node": 2, "cpu_memory_gib": 16}
TWO_CLUSTERS = [{"name": "cpu-a", "max_gpus": 8, **CPU}, {"name": "cpu-b", "max_gpus": 8, **CPU}]


def test_an_auto_submit_costs_the_same_beside_10_or_1000_jobs_on_each_cluster(
    pg_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Placement plans the job for each cluster and reads each one's expected start (the
    limits it waits for, the GPUs waiting ahead, the predicted ends of the jobs holding them)
    in a few aggregate statements per cluster, whatever the backlog there."""
    profiles_file = tmp_path / "clusters.yaml"
    profiles_file.write_text(yaml.safe_dump({"clusters": TWO_CLUSTERS}))
    settings = pg_settings.model_copy(
        update={"clusters": ClusterSettings(profiles_file=profiles_file)}
    )
    profiles = [ClusterProfile.model_validate(p) for p in TWO_CLUSTERS]
    url = settings.database_url
    tokens = three_users(url)
    auto = tiny_spec("measured", training={**tiny_spec()["training"], "steps": 100})
    auto["resources"] = {**auto["resources"], "cluster": "auto", "clusters": ["cpu-a", "cpu-b"]}

    def backlog(count: int) -> None:
        for profile in profiles:  # each cluster full, with jobs of known length waiting
            store_jobs(url, "bob", count, admit=True, profile=profile, steps=1000)
            store_jobs(url, "bob", count, admit=False, profile=profile, steps=1000)

    with TestClient(create_app(settings)) as client:
        backlog(10)
        counted_submit(client, url, tokens["root"], monkeypatch, auto)  # warm
        small, first = counted_submit(client, url, tokens["alice"], monkeypatch, auto)
        backlog(990)
        large, second = counted_submit(client, url, tokens["alice"], monkeypatch, auto)

    assert first["status"] == second["status"] == "PENDING"
    assert "expected to start in" in second["advice_reason"]
    assert large.statements == small.statements
    assert large.rows == small.rows


# A statement that names a job's spec or plan column (spec_digest is a column of its own).
SPEC_OR_PLAN = re.compile(r"\bjob\.(spec|plan)\b")


@contextmanager
def sql_sent(database_url: str) -> Iterator[list[str]]:
    """The SQL text of every statement the ORM sends meanwhile (the API's engine is this one)."""
    sent: list[str] = []

    def record(_connection: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    engine = get_engine(database_url)
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", record)


def test_admission_the_queue_teams_and_job_lists_read_no_spec_or_plan(
    client: TestClient, pg_settings: Settings
) -> None:
    url = pg_settings.database_url
    tokens = three_users(url)
    set_quota(url, "speech", 2)
    store_jobs(url, "bob", 1, admit=True)  # holds speech's 2 GPUs
    store_jobs(url, "bob", 5, admit=False)  # and these wait behind it
    reads = {
        "/v1/teams": tokens["root"],
        "/console/api/queue": tokens["root"],
        "/v1/jobs?team=speech": tokens["root"],
        "/v1/jobs": tokens["bob"],
    }

    with sql_sent(url) as sent:
        with Session(get_engine(url)) as session:
            launches = admit_pending(session, {LOCAL_PROFILE.name: LOCAL_PROFILE})
            session.commit()
        answers = {path: client.get(path, headers=auth(token)) for path, token in reads.items()}

    assert launches == []
    assert all(answer.status_code == 200 for answer in answers.values())
    teams = {team["name"]: team for team in answers["/v1/teams"].json()}
    assert (teams["speech"]["jobs_waiting"], teams["speech"]["gpus_held"]) == (5, 2)
    queue = answers["/console/api/queue"].json()
    assert [(job["position"], job["gpus"]) for job in queue] == [(n, 2) for n in range(1, 6)]
    assert queue[0]["why"] == "team speech holds 2 of its 2-GPU quota; this job needs 2"
    for path in ("/v1/jobs?team=speech", "/v1/jobs"):
        listed = answers[path].json()
        assert listed["count"] == 6 and len(listed["data"]) == 6
        assert {job["team"] for job in listed["data"]} == {"speech"}
    assert len(sent) >= 8, "the statements were not captured"
    assert [statement for statement in sent if SPEC_OR_PLAN.search(statement)] == []
