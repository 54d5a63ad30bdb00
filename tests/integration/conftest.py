"""The API in-process over the real database and Redis of the shared fixtures, with users.

The ``shared_*`` fixtures hold one PostgreSQL database, app and set of users for a whole
module: the fuzzers send hundreds of requests, and a database per example would cost more
than the requests themselves.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.db.migrate import upgrade
from service.db.session import get_engine
from service.settings import AuthSettings, BrokerSettings, DatabaseSettings, Settings
from tests.conftest import POSTGRES_ADMIN_DSN, REDIS_URL
from tests.integration.helpers import auth, three_users, tiny_spec


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture
def tokens(settings: Settings) -> dict[str, str]:
    """alice (team vision), bob (speech) and root (an admin in ops)."""
    return three_users(settings.database_url)


@pytest.fixture(scope="module")
def shared_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A migrated PostgreSQL database and an emptied Redis database, for one module."""
    name = f"zp_test_{secrets.token_hex(4)}"
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    url = f"{base}/{name}"
    upgrade(url)
    redis.Redis.from_url(REDIS_URL).flushdb()
    yield Settings(
        data_dir=Path(tmp_path_factory.mktemp("data")),
        db=DatabaseSettings(url=url),
        broker=BrokerSettings(url=REDIS_URL),
        auth=AuthSettings(secret_key="test-secret-key"),
    )
    redis.Redis.from_url(REDIS_URL).flushdb()
    get_engine(url).dispose()
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def shared_app(shared_settings: Settings) -> FastAPI:
    return create_app(shared_settings)


@pytest.fixture(scope="module")
def shared_client(shared_app: FastAPI) -> Iterator[TestClient]:
    with TestClient(shared_app) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def shared_tokens(shared_settings: Settings) -> dict[str, str]:
    """alice (team vision), bob (speech) and root (an admin in ops), for one module."""
    return three_users(shared_settings.database_url)


@pytest.fixture(scope="module")
def shared_job(shared_client: TestClient, shared_tokens: dict[str, str]) -> dict[str, object]:
    """A stored job of alice's (its first attempt is the one runtime reports go to)."""
    response = shared_client.post(
        "/v1/jobs", json=tiny_spec(), headers=auth(shared_tokens["alice"])
    )
    assert response.status_code == 201, response.text
    job: dict[str, object] = response.json()
    return job
