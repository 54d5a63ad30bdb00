"""Migrations that move data, run over rows written by the schema before them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from service.db.migrate import alembic_config
from service.db.session import get_engine


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/zeropilot.db"
    return str(request.getfixturevalue("postgres_url"))


def insert_job(connection: sa.Connection, job_id: str, nodes: int, gpus_per_node: int) -> None:
    """A job row as revision 0005 stored it: its GPUs only inside the spec."""
    spec = {"name": "old", "resources": {"cluster": "local", "nodes": nodes,
            "gpus_per_node": gpus_per_node}}  # fmt: skip
    connection.execute(
        sa.text(
            "INSERT INTO job (id, name, team_id, user_id, status, priority, cluster, spec, plan, "
            "advice_reason, current_attempt, message, spec_digest, created_at, updated_at) "
            "VALUES (:id, 'old', 1, 1, 'PENDING', 50, 'local', :spec, '{}', '', 1, '', 'd', "
            "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
        ),
        {"id": job_id, "spec": json.dumps(spec)},
    )


def test_0006_gives_every_stored_job_its_gpus_from_its_spec(empty_database: str) -> None:
    config = alembic_config(empty_database)
    command.upgrade(config, "0005")
    engine = get_engine(empty_database)
    with engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO team (name, gpu_share, created_at) "
                                   "VALUES ('vision', 1, CURRENT_TIMESTAMP)"))  # fmt: skip
        connection.execute(sa.text(
            "INSERT INTO \"user\" (name, team_id, is_admin, role, token_hash, created_at) "
            "VALUES ('alice', 1, false, 'member', 'hash', CURRENT_TIMESTAMP)"
        ))  # fmt: skip
        insert_job(connection, "one-by-two", 1, 2)
        insert_job(connection, "three-by-eight", 3, 8)

    command.upgrade(config, "head")

    with engine.connect() as connection:
        gpus = connection.execute(sa.text("SELECT id, gpus FROM job ORDER BY id")).all()
        assert [tuple(row) for row in gpus] == [("one-by-two", 2), ("three-by-eight", 24)]
        with pytest.raises(sa.exc.IntegrityError):  # a job written without its GPUs is refused
            insert_job(connection, "no-gpus", 1, 1)
