"""Engines and sessions for SQLite (embedded) and PostgreSQL (production)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import Session, create_engine

AUTOCOMMIT = "AUTOCOMMIT"


@lru_cache(maxsize=8)
def get_engine(url: str, echo: bool = False) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(
            url, echo=echo, connect_args={"check_same_thread": False, "timeout": 30}
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, echo=echo, pool_pre_ping=True)


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
