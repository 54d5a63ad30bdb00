"""Statements compiled once per dialect and run on the driver's cursor: the submit's hot path.

Through the ORM session each statement of a submit paid for a cache-key walk, an execution
context and result objects, about 0.2 ms of CPU apiece, and a submit writes five. Here a
statement is built from the models (so names, quoting and casts are SQLAlchemy's), compiled once
per dialect, and run on the DBAPI cursor of the session's connection: in the session's
transaction, with each column's own bind processor (JSON, datetimes), so what is stored is
exactly what the ORM would store. Driver errors come out as SQLAlchemy's, a lost connection is
invalidated, as on the ORM path.

On psycopg the statements are rendered with PostgreSQL's own ``$n`` placeholders and sent by a
``RawCursor``, as they are: a normal cursor parses every query for its ``%s`` placeholders and
caches the result only for queries under 4 KB and 50 parameters, and the submit's one statement
(``new_job``) has 65, so its parsing was a fifth of the submit's database work.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from psycopg import Connection as PsycopgConnection
from psycopg import RawCursor
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement
from sqlmodel import Session

Params = dict[str, Any] | tuple[Any, ...]


@dataclass(frozen=True)
class Prepared:
    sql: str
    names: tuple[str, ...]  # every parameter, in the order a positional driver takes them
    positional: bool
    processors: dict[str, Callable[[Any], Any]]
    raw: bool  # run on psycopg's RawCursor: ``sql`` has $n placeholders

    def params(self, values: Mapping[str, Any]) -> Params:
        bound = {name: self._bind(name, values[name]) for name in self.names}
        return tuple(bound[name] for name in self.names) if self.positional else bound

    def _bind(self, name: str, value: Any) -> Any:
        process = self.processors.get(name)
        return value if process is None else process(value)


_prepared: dict[tuple[ClauseElement, type[Dialect], tuple[str, ...]], Prepared] = {}


def prepared(statement: ClauseElement, dialect: Dialect, keys: Sequence[str] = ()) -> Prepared:
    """``statement`` (a statement built once, as the cache holds it by identity) compiled for
    ``dialect``; an INSERT without values takes ``keys`` as its columns."""
    cache_key = (statement, type(dialect), tuple(keys))  # the driver's, not only its name
    found = _prepared.get(cache_key)
    if found is None:
        raw = dialect.driver == "psycopg"
        render = _dollar_placeholders(type(dialect)) if raw else dialect
        done = cast(SQLCompiler, statement.compile(dialect=render, column_keys=list(keys) or None))
        names = tuple(done.positiontup or ()) if render.positional else tuple(done.binds)
        processors: dict[str, Callable[[Any], Any]] = {}
        for name in names:  # the values bind as the engine's own dialect binds them
            process = done.binds[name].type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                processors[name] = process
        found = Prepared(done.string, names, render.positional, processors, raw)
        _prepared[cache_key] = found
    return found


_dollar: dict[type[Dialect], Dialect] = {}


def _dollar_placeholders(dialect_class: type[Dialect]) -> Dialect:
    """The dialect rendering ``$1, $2, ...``: the statement is otherwise the same."""
    found = _dollar.get(dialect_class)
    if found is None:
        found = _dollar[dialect_class] = cast(Any, dialect_class)(paramstyle="numeric_dollar")
    return found


def execute(
    session: Session,
    statement: ClauseElement,
    rows: Sequence[Mapping[str, Any]],
    *,
    keys: Sequence[str] = (),
    fetch: bool = False,
    fetch_all: bool = False,
) -> list[Any]:
    """Run ``statement`` once per row of values in the session's transaction; with ``fetch``,
    the first row each run returned (None where none), in order; with ``fetch_all``, the list
    of rows each run returned."""
    connection = session.connection()
    plan = prepared(statement, connection.dialect, keys)
    params: list[Any] = [plan.params(row) for row in rows]
    pooled = connection.connection
    if plan.raw:
        cursor: Any = RawCursor(cast(PsycopgConnection[Any], pooled.dbapi_connection))
    else:
        cursor = pooled.cursor()
    # One statement per row, not executemany: psycopg pipelines that, which saved two round
    # trips on a submit's three events but cost the API more CPU than it saved time.
    found = []
    try:
        for one in params:
            cursor.execute(plan.sql, one)
            if fetch:
                found.append(cursor.fetchone())
            elif fetch_all:
                found.append(cursor.fetchall())
        return found
    except connection.dialect.loaded_dbapi.Error as exc:
        raise _as_sqlalchemy_error(connection, cursor, plan.sql, params, exc) from exc
    finally:
        cursor.close()


def _as_sqlalchemy_error(
    connection: Connection, cursor: Any, sql: str, params: list[Any], exc: Any
) -> StatementError:
    """The error the ORM path would raise; a lost connection is invalidated, not reused."""
    dialect = connection.dialect
    lost: bool = dialect.is_disconnect(exc, connection.connection, cursor)
    if lost:
        connection.invalidate(exc)
    error: StatementError = DBAPIError.instance(
        sql,
        params,
        exc,
        dialect.loaded_dbapi.Error,
        connection_invalidated=lost,
        dialect=dialect,
        ismulti=len(params) > 1,
    )
    return error
