"""The API in-process over the real database and Redis of the shared fixtures, with users."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.settings import Settings
from tests.integration.helpers import three_users


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture
def tokens(settings: Settings) -> dict[str, str]:
    """alice (team vision), bob (speech) and root (an admin in ops)."""
    return three_users(settings.database_url)
