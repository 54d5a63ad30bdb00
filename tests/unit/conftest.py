"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.scripted_api import ScriptedApi


@pytest.fixture
def scripted() -> Iterator[list[ScriptedApi]]:
    """The scripted servers a test starts (``scripted_api.serve``), stopped after it."""
    made: list[ScriptedApi] = []
    yield made
    for api in made:
        api.server.shutdown()
        api.server.server_close()
