"""Debian's Chromium (/usr/bin/chromium, installed by scripts/browser.sh) driven by Playwright,
never a downloaded browser, against a real stack on PostgreSQL and Redis."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from service.db.migrate import upgrade
from tests.e2e.conftest import user_token
from tests.e2e.stack import Stack
from tests.integration.helpers import REPO

CHROMIUM = "/usr/bin/chromium"
# No GPU, no sandbox as root, and none of Chromium's own calls home (this network is closed).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no {CHROMIUM}: run scripts/browser.sh (Debian's chromium package)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1320, "height": 900}, accept_downloads=True)
    opened = context.new_page()
    opened.set_default_timeout(30_000)
    yield opened
    context.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Screenshots are kept here for people to look at (CI keeps the folder)."""
    folder = Path(os.environ.get("ZEROPILOT_UI_ARTIFACTS", REPO / "build" / "ui-screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def stack(tmp_path: Path, postgres_url: str, redis_url: str) -> Iterator[Stack]:
    upgrade(postgres_url)
    running = Stack(tmp_path / "data", postgres_url, redis_url)
    running.start_api()
    yield running
    running.stop()


@pytest.fixture
def token(stack: Stack, postgres_url: str) -> str:
    return user_token(postgres_url)
