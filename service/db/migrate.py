"""Run Alembic migrations against the configured database (``alembic upgrade head``)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from service.db.session import get_engine

_INI = Path(__file__).with_name("alembic.ini")


def alembic_config(url: str) -> Config:
    config = Config(str(_INI))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str) -> None:
    command.upgrade(alembic_config(url), "head")


def check(url: str) -> None:
    """Raise if the models and the migrations disagree (``alembic check``)."""
    command.check(alembic_config(url))


def is_at_head(url: str) -> bool:
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    with get_engine(url).connect() as connection:
        return MigrationContext.configure(connection).get_current_revision() == head
