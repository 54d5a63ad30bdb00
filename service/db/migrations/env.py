"""Alembic environment: migrate zeropilot's tables on SQLite or PostgreSQL."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import service.db.models  # noqa: F401  (registers the tables on SQLModel.metadata)
from service.db.session import get_engine

config = context.config
url = config.get_main_option("sqlalchemy.url")
if not url:
    raise RuntimeError("service.db.migrate sets sqlalchemy.url; run migrations through it")


def run_migrations_online() -> None:
    with get_engine(url).connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=SQLModel.metadata,
            render_as_batch=connection.dialect.name == "sqlite",  # SQLite cannot ALTER in place
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()


run_migrations_online()
