"""Engines and sessions for SQLite (embedded) and PostgreSQL (production)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection
from sqlmodel import Session, create_engine

AUTOCOMMIT = "AUTOCOMMIT"
# A connection back in the pool for less than this is not pinged when it is taken again.
IDLE_BEFORE_PING_S = 1.0


@lru_cache(maxsize=8)
def get_engine(url: str, echo: bool = False) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(
            url, echo=echo, connect_args={"check_same_thread": False, "timeout": 30}
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    engine = create_engine(url, echo=echo)
    _ping_connections_left_idle(engine)
    return engine


def _ping_connections_left_idle(engine: Engine) -> None:
    """A pooled connection is pinged before use only if it sat idle: one that served a request
    a moment ago is as alive as a ping would show, and a ping on every checkout was one of the
    three round trips of a submit. One found dead is replaced, as ``pool_pre_ping`` does; a
    server lost within the idle time is met by the request's own statement (503, then the
    pool reconnects)."""

    def note_checkin(_dbapi: Any, record: ConnectionPoolEntry) -> None:
        record.info["checked_in"] = time.monotonic()

    def ping_if_idle(dbapi: Any, record: ConnectionPoolEntry, _: PoolProxiedConnection) -> None:
        checked_in = record.info.get("checked_in")
        if checked_in is None or time.monotonic() - checked_in < IDLE_BEFORE_PING_S:
            return  # new (connected just now) or busy
        try:
            engine.dialect.do_ping(dbapi)
        except engine.dialect.loaded_dbapi.Error as exc:
            raise DisconnectionError(f"the pooled connection is lost: {exc}") from exc

    event.listen(engine, "checkin", note_checkin)
    event.listen(engine, "checkout", ping_if_idle)


@lru_cache(maxsize=8)
def autocommit(engine: Engine) -> Engine:
    """``engine``, its connections in autocommit: each statement its own transaction."""
    return engine.execution_options(isolation_level=AUTOCOMMIT)


def in_autocommit(session: Session) -> bool:
    """Whether each statement of ``session`` commits on its own (no transaction to roll back)."""
    return session.connection().get_execution_options().get("isolation_level") == AUTOCOMMIT


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # API, worker and training reports write concurrently: WAL lets readers proceed meanwhile.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    with Session(get_engine(url)) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
