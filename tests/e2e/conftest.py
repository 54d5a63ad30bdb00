"""A running stack (API + worker processes) on PostgreSQL and Redis, with a user token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import Session

from service.db.migrate import upgrade
from service.db.session import get_engine
from service.db.users import create_user
from tests.e2e.stack import Api, Stack


@pytest.fixture
def stack(tmp_path: Path, postgres_url: str, redis_url: str) -> Iterator[Stack]:
    upgrade(postgres_url)
    running = Stack(tmp_path / "data", postgres_url, redis_url)
    running.start_api()
    yield running
    running.stop()


def user_token(database_url: str) -> str:
    """A token of user alice in team vision, created straight in the database."""
    with Session(get_engine(database_url)) as session:
        made = create_user(session, "alice", "vision")
        session.commit()
    return made


@pytest.fixture
def token(stack: Stack, postgres_url: str) -> str:
    return user_token(postgres_url)


@pytest.fixture
def api(stack: Stack, token: str) -> Api:
    return Api(stack.url, token)
