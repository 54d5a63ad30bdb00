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


# Attempts as 0013 stored them: (rung, failure_evidence) -> the kind 0014 gives each.
RUNGS_0013 = [
    ("advisor", {}, "advisor"),
    ("micro-batch 8 -> 4 (accumulation 1 -> 2)", {"class": "OOM_GPU"}, "escalation"),
    ("retry: other processes held the GPU", {}, "oom_retry"),
    ("retry after a disruption (DisruptionTarget)", {}, "disruption"),
    ("resume after a stop (PREEMPTED)", {"stop_grace": "3 s, the spec's checkpoint.grace_s",
                                         "stop_grace_s": 3, "class": "PREEMPTED"}, "stop"),
    ("resume after preemption (by job 0123456789abcdef)", {}, "preemption"),
    ("re-placed on cpu-b after the launch on gpu-a failed", {}, "replacement"),
    ("ZeRO-2 -> ZeRO-3", {"launch_tries": 2, "launch_error": "image not found",
                          "launch_cluster": "gpu-a", "class": "LAUNCH_ERROR"}, "escalation"),
]  # fmt: skip


def insert_attempt(connection: sa.Connection, number: int, rung: str, evidence: dict) -> None:
    connection.execute(
        sa.text(
            "INSERT INTO attempt (id, job_id, number, status, plan, rung, backend, backend_name, "
            "native_state, failure_message, failure_evidence, runtime_evidence, created_at, "
            "updated_at) VALUES (:id, 'old', :number, 'FAILED', '{}', :rung, 'local', :name, '', "
            "'', :evidence, '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
        ),
        {"id": f"a{number}", "number": number, "rung": rung, "name": f"zp-old-a{number}",
         "evidence": json.dumps(evidence)},
    )  # fmt: skip


def test_0014_gives_each_attempt_its_kind_and_moves_launch_and_stop_keys_to_columns(
    empty_database: str,
) -> None:
    config = alembic_config(empty_database)
    command.upgrade(config, "0013")
    engine = get_engine(empty_database)
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO team (name, gpu_share, checkpoint_roots, "
                "created_at) VALUES ('vision', 1, '[]', CURRENT_TIMESTAMP)"
            )
        )
        connection.execute(sa.text(
            "INSERT INTO \"user\" (name, team_id, is_admin, role, token_hash, created_at) "
            "VALUES ('alice', 1, false, 'member', 'hash', CURRENT_TIMESTAMP)"
        ))  # fmt: skip
        connection.execute(sa.text(
            "INSERT INTO job (id, name, team_id, user_id, status, priority, cluster, gpus, spec, "
            "plan, advice_reason, current_attempt, message, spec_digest, created_at, updated_at) "
            "VALUES ('old', 'old', 1, 1, 'FAILED', 50, 'local', 1, '{}', '{}', '', 8, '', 'd', "
            "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
        ))  # fmt: skip
        for number, (rung, evidence, _kind) in enumerate(RUNGS_0013, start=1):
            insert_attempt(connection, number, rung, evidence)

    command.upgrade(config, "0014")

    query = ("SELECT kind, launch_tries, launch_error, launch_cluster, stop_grace_s, stop_grace, "
             "failure_evidence FROM attempt ORDER BY number")  # fmt: skip
    with engine.connect() as connection:
        rows = [tuple(row) for row in connection.execute(sa.text(query))]
    assert [row[0] for row in rows] == [kind for _rung, _evidence, kind in RUNGS_0013]
    evidence = [json.loads(row[6]) if isinstance(row[6], str) else row[6] for row in rows]
    assert rows[4][1:6] == (0, None, None, 3.0, "3 s, the spec's checkpoint.grace_s")
    assert evidence[4] == {"class": "PREEMPTED"}
    assert rows[7][1:6] == (2, "image not found", "gpu-a", None, None)
    assert evidence[7] == {"class": "LAUNCH_ERROR"}
    assert [row[1:6] for row in rows[:4]] == [(0, None, None, None, None)] * 4

    command.downgrade(config, "0013")

    with engine.connect() as connection:
        stored = connection.execute(
            sa.text("SELECT rung, failure_evidence FROM attempt ORDER BY number")
        ).all()
    assert [(rung, json.loads(e) if isinstance(e, str) else e) for rung, e in stored] == [
        (rung, evidence) for rung, evidence, _kind in RUNGS_0013
    ]


def test_0015_reads_each_stored_jobs_time_limit_and_leaves_it_unpredicted(
    empty_database: str,
) -> None:
    config = alembic_config(empty_database)
    command.upgrade(config, "0014")
    engine = get_engine(empty_database)
    limited = {"name": "old", "resources": {"cluster": "local", "nodes": 1, "gpus_per_node": 2,
                                            "time_limit_minutes": 90}}  # fmt: skip
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO team (name, gpu_share, checkpoint_roots, "
                "created_at) VALUES ('vision', 1, '[]', CURRENT_TIMESTAMP)"
            )
        )
        connection.execute(sa.text(
            "INSERT INTO \"user\" (name, team_id, is_admin, role, token_hash, created_at) "
            "VALUES ('alice', 1, false, 'member', 'hash', CURRENT_TIMESTAMP)"
        ))  # fmt: skip
        for job_id, spec in (("no-limit", {**limited, "resources": {"nodes": 1}}),
                             ("limited", limited)):  # fmt: skip
            connection.execute(sa.text(
                "INSERT INTO job (id, name, team_id, user_id, status, priority, cluster, gpus, "
                "spec, plan, advice_reason, current_attempt, message, spec_digest, created_at, "
                "updated_at) VALUES (:id, 'old', 1, 1, 'PENDING', 50, 'local', 2, :spec, '{}', "
                "'', 1, '', 'd', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            ), {"id": job_id, "spec": json.dumps(spec)})  # fmt: skip

    command.upgrade(config, "0015")

    query = ("SELECT id, time_limit_s, predicted_start_at, prediction_basis, "
             "start_prediction_error_s FROM job ORDER BY id")  # fmt: skip
    with engine.connect() as connection:
        rows = [tuple(row) for row in connection.execute(sa.text(query))]
    assert rows == [("limited", 5400.0, None, "", None), ("no-limit", None, None, "", None)]

    command.downgrade(config, "0014")

    with engine.connect() as connection:
        columns = {c["name"] for c in sa.inspect(connection).get_columns("job")}
    assert "time_limit_s" not in columns and "predicted_start_at" not in columns


def test_0016_adds_observations_and_calibrations_and_takes_them_away_again(
    empty_database: str,
) -> None:
    config = alembic_config(empty_database)
    command.upgrade(config, "0015")
    engine = get_engine(empty_database)

    command.upgrade(config, "0016")

    with engine.begin() as connection:
        connection.execute(sa.text(
            "INSERT INTO clustercalibration (cluster, multipliers, gpu_share, cpu_share, "
            "observations, typical_error, memory_reason, frozen, updated_at) VALUES ('local', "
            "'{\"mfu_max\": 0.5}', 0, 0.1, 5, 0.04, '', true, CURRENT_TIMESTAMP)"
        ))  # fmt: skip
    with engine.connect() as connection:
        stored = connection.execute(
            sa.text("SELECT cluster, observations, frozen FROM clustercalibration")
        ).all()
        assert [tuple(row) for row in stored] == [("local", 5, True)]
        assert connection.execute(sa.text("SELECT count(*) FROM attemptobservation")).scalar() == 0

    command.downgrade(config, "0015")

    assert not {"attemptobservation", "clustercalibration"} & set(
        sa.inspect(engine).get_table_names()
    )
