"""Writing a submitted job: the job, attempt 1, their events and, when it is admitted as it is
stored, its GPUs in the team's counter.

On PostgreSQL all of that is one statement (the other inserts as data-modifying CTEs of the
events' INSERT): one round trip instead of four to six, each of which cost the API and the
database CPU and, on busy cores, a wait for the other process to be scheduled. The statement is
atomic on its own, so a unique violation (a concurrent Idempotency-Key) leaves nothing written.
SQLite has no INSERT inside WITH: there it is one statement per table.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import BindParameter, Table, bindparam, insert
from sqlalchemy.engine import Engine
from sqlalchemy.sql.dml import ReturningInsert
from sqlmodel import Session

from service.db import plain
from service.db.held_gpus import HeldChange, add_held, upsert
from service.db.models import Attempt, Job, JobEvent
from service.db.rows import Row, insert_rows

# What tells a submit's events apart, to give each the id the database returned with it.
_EVENT_IDENTITY = ("subject", "attempt_number", "from_status", "to_status", "reason")


def writes_in_one_statement(engine: Engine) -> bool:
    """Whether ``write_new_job`` is one statement there: atomic without a transaction."""
    return engine.dialect.name == "postgresql"


def write_new_job(
    session: Session, job: Row, attempt: Row, events: list[Row], held: HeldChange | None
) -> None:
    """Write the rows in the session's transaction; each event gets its id from the database."""
    if not writes_in_one_statement(session.get_bind().engine):
        if held is not None:
            add_held(session, held)
        insert_rows(session, Job, [job])
        insert_rows(session, Attempt, [attempt])
        insert_rows(session, JobEvent, events)
        return
    statement = _one_statement(len(events), held is not None)
    values = _prefixed("job_", job) | _prefixed("attempt_", attempt)
    for index, event in enumerate(events):
        values |= _prefixed(f"event{index}_", event)
    if held is not None:
        values |= _prefixed("held_", held.values())
    returned = plain.execute(session, statement, [values], fetch_all=True)[0]
    _give_ids(events, returned)


def _prefixed(prefix: str, row: Row) -> dict[str, Any]:
    return {f"{prefix}{key}": value for key, value in row.items()}


def _give_ids(events: list[Row], returned: Sequence[tuple[Any, ...]]) -> None:
    """Match returned rows to events by content (RETURNING's order is not promised); events
    alike get their ids in the order they were given, as one INSERT per row would."""
    waiting = list(events)
    for row_id, *identity in sorted(returned):
        event = next(e for e in waiting if tuple(e[k] for k in _EVENT_IDENTITY) == tuple(identity))
        event["id"] = row_id
        waiting.remove(event)


@lru_cache(maxsize=8)
def _one_statement(event_count: int, with_held: bool) -> ReturningInsert[Any]:
    """Built once per shape (and so compiled once by ``plain``): every column of each row is a
    parameter named after its table, typed as its column (JSON and datetimes bind as the
    ORM binds them)."""
    job_table: Table = Job.__table__  # type: ignore[attr-defined]
    attempt_table: Table = Attempt.__table__  # type: ignore[attr-defined]
    event_table: Table = JobEvent.__table__  # type: ignore[attr-defined]
    ctes = []
    if with_held:
        ctes.append(upsert("postgresql", prefix="held_").cte("held"))
    ctes.append(insert(job_table).values(_binds(job_table, "job_")).cte("new_job"))
    ctes.append(insert(attempt_table).values(_binds(attempt_table, "attempt_")).cte("new_attempt"))
    event_rows = [_binds(event_table, f"event{index}_", skip="id") for index in range(event_count)]
    returning = [event_table.c.id, *(event_table.c[key] for key in _EVENT_IDENTITY)]
    return insert(event_table).values(event_rows).returning(*returning).add_cte(*ctes)


def _binds(table: Table, prefix: str, skip: str = "") -> dict[str, BindParameter[Any]]:
    return {
        column.key: bindparam(f"{prefix}{column.key}", type_=column.type)
        for column in table.columns
        if column.key != skip
    }
