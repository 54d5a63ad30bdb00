"""The pool's liveness check: a connection the server dropped while it sat idle in the pool is
replaced before use (a request never sees it), as ``pool_pre_ping`` did; one dropped while in
use fails the statement that meets it once, and the pool reconnects for the next."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from service.db import session as db_session
from service.db.session import get_engine
from tests.conftest import POSTGRES_ADMIN_DSN


def backend_pid(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT pg_backend_pid()")).scalar_one())


def terminate(pid: int) -> None:
    """What a restarted or failed-over server does to its clients' sessions."""
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone() == (True,)


def test_a_connection_dropped_while_idle_is_replaced_before_use(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db_session, "IDLE_BEFORE_PING_S", 0.0)  # every pooled one counts as idle
    engine = get_engine(postgres_url)
    first = backend_pid(engine)
    terminate(first)
    second = backend_pid(engine)  # no error: the ping found it dead and the pool reconnected
    assert second != first


def test_a_connection_dropped_while_busy_fails_once_then_the_pool_reconnects(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db_session, "IDLE_BEFORE_PING_S", 3600.0)  # never pinged: just used
    engine = get_engine(postgres_url)
    first = backend_pid(engine)
    terminate(first)
    with pytest.raises(DBAPIError) as lost:
        backend_pid(engine)
    assert lost.value.connection_invalidated
    assert backend_pid(engine) != first
