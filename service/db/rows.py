"""New rows as plain dicts, written by statements compiled once (``plain``): the submit's hot path.

Building a SQLModel table object validates and instruments every field, and the ORM's unit of
work then tracks it; for rows written once and answered at once, that was most of a submit's
time. The values come from validated input, and the model's own defaults fill the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from pydantic_core import PydanticUndefined
from sqlalchemy import Insert, Table, insert
from sqlalchemy.sql.dml import ReturningInsert
from sqlmodel import Session, SQLModel

from service.db import plain

Row = dict[str, Any]


def new_row(model: type[SQLModel], **values: Any) -> Row:
    """A row as ``model(**values)`` would hold it, defaults included, without building one."""
    row = {}
    for name, default, factory in _defaults(model):
        if name in values:
            row[name] = values.pop(name)
        elif factory is not None:
            row[name] = factory()
        elif default is PydanticUndefined:
            raise TypeError(f"{model.__name__}.{name} has no default: give it")
        else:
            row[name] = default
    if values:
        raise TypeError(f"{model.__name__} has no fields {sorted(values)}")
    return row


@lru_cache(maxsize=16)
def _defaults(model: type[SQLModel]) -> list[tuple[str, Any, Callable[[], Any] | None]]:
    """Each field's default or default factory, looked up once (pydantic inspects the factory's
    signature on every ``get_default``)."""
    fields = model.model_fields.items()
    return [(name, field.default, field.default_factory) for name, field in fields]  # type: ignore[misc]


def insert_rows(session: Session, model: type[SQLModel], rows: list[Row]) -> None:
    """One INSERT per row (``plain.execute``), in the session's transaction; an autoincrement
    ``id`` left None is filled from the database, in order."""
    table = model.__table__  # type: ignore[attr-defined]
    if rows[0].get("id", "") is None:
        keys = [key for key in rows[0] if key != "id"]
        returned = plain.execute(session, _returning_id(table), rows, keys=keys, fetch=True)
        for row, (row_id,) in zip(rows, returned, strict=True):
            row["id"] = row_id
    else:
        plain.execute(session, _insert(table), rows, keys=list(rows[0]))


@lru_cache(maxsize=16)
def _insert(table: Table) -> Insert:
    return insert(table)


@lru_cache(maxsize=16)
def _returning_id(table: Table) -> ReturningInsert[Any]:
    return insert(table).returning(table.c.id)
