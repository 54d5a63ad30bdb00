"""A running stack (API + worker processes) on PostgreSQL and Redis, with a user token; a
namespace of its own on the tests' Kubernetes control plane."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import Session

from service.db.migrate import upgrade
from service.db.session import get_engine
from service.db.users import create_user
from tests.e2e.stack import Api, Stack
from tests.integration.k8s_control_plane import ControlPlane


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


@pytest.fixture
def namespace(kube_control_plane: ControlPlane) -> Iterator[str]:
    api = kube_control_plane.api
    assert api is not None
    name = f"e2e-{secrets.token_hex(4)}"
    assert api.post("/api/v1/namespaces", json={"metadata": {"name": name}}).is_success
    deadline = time.monotonic() + 30  # pods are refused until its default ServiceAccount exists
    while not api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default").is_success:
        assert time.monotonic() < deadline, "no default ServiceAccount"
        time.sleep(0.1)
    yield name
    api.delete(f"/apis/batch/v1/namespaces/{name}/jobs", params={"propagationPolicy": "Background"})
    api.delete(f"/api/v1/namespaces/{name}/pods", params={"gracePeriodSeconds": 0})
    api.delete(f"/api/v1/namespaces/{name}")
