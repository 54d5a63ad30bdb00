"""Shared fixtures: real databases (SQLite file and a fresh PostgreSQL database), real Redis."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from service.db.migrate import upgrade
from service.db.session import get_engine
from service.settings import (
    AuthSettings,
    BrokerSettings,
    DatabaseSettings,
    Settings,
    WorkerSettings,
)
from workers.backends import kubernetes_watch
from workers.backends.shm import remove_orphaned_buffers

REPO = Path(__file__).resolve().parents[1]
pytest_plugins = [
    "tests.integration.slurm_fixtures",  # the session-wide local Slurm cluster
    "tests.integration.k8s_control_plane",  # the session-wide Kubernetes control plane
]
POSTGRES_ADMIN_DSN = os.environ.get(
    "ZEROPILOT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("ZEROPILOT_TEST_REDIS", "redis://127.0.0.1:6379/11")


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A new, empty PostgreSQL database for one test, dropped afterwards."""
    name = f"zp_test_{secrets.token_hex(4)}"
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    url = f"{base}/{name}"
    yield url
    get_engine(url).dispose()
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated database of each kind; tests using it run once per kind."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'zeropilot.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    upgrade(url)
    return url


@pytest.fixture
def redis_url() -> Iterator[str]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield REDIS_URL
    client.flushdb()


@pytest.fixture
def settings(tmp_path: Path, database_url: str, redis_url: str) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        db=DatabaseSettings(url=database_url),
        broker=BrokerSettings(url=redis_url),
        auth=AuthSettings(secret_key="test-secret-key"),
        workers=WorkerSettings(reconcile_interval_s=1.0, launch_lease_s=5.0),
    )


@pytest.fixture(scope="session", autouse=True)
def no_deepspeed_buffers_left_behind() -> Iterator[None]:
    """Sweep DeepSpeed's orphaned CPU all-reduce buffers (66 MiB a rank) after the session:
    worlds the tests killed, or launched without zeropilot's supervisor, leave them in RAM."""
    yield
    remove_orphaned_buffers(min_age_s=0)


@pytest.fixture(autouse=True)
def no_kubernetes_watches_left_behind() -> Iterator[None]:
    """A pass in the test process starts watched copies of a namespace (kubernetes_watch):
    they go with the test, not on against a namespace or control plane that is gone."""
    yield
    kubernetes_watch.stop_all()


# Tests that need the machine's one Slurm cluster or the session's Kubernetes control plane:
# `--part clusters` runs just these, `--part rest` the others, so that scripts/test.sh can run
# the two parts side by side without two runs sharing a cluster.
CLUSTER_FIXTURES = frozenset({"slurm_cluster", "kube_control_plane"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--part",
        choices=("clusters", "rest"),
        help="only the tests that use the Slurm cluster or Kubernetes control plane, or the rest",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    part = config.getoption("--part")
    if part is None:
        return
    wanted = part == "clusters"
    kept = [item for item in items if uses_a_cluster(item) == wanted]
    dropped = [item for item in items if uses_a_cluster(item) != wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def uses_a_cluster(item: pytest.Item) -> bool:
    return not CLUSTER_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


_TIER_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add up each tier's time (setup, call and teardown; session fixtures count where first
    used), for the summary below: the suite's budget is kept per tier."""
    parts = report.nodeid.split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"
    _TIER_SECONDS[tier] = _TIER_SECONDS.get(tier, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _TIER_SECONDS:
        times = ", ".join(f"{tier} {s / 60:.1f} min" for tier, s in sorted(_TIER_SECONDS.items()))
        terminalreporter.write_line(f"time by tier: {times}")
