"""New rows as plain dicts, written with one INSERT per table: the submit's hot path.

Building a SQLModel table object validates and instruments every field, and the ORM's unit of
work then tracks it; for rows written once and answered at once, that was most of a submit's
time. The values come from validated input, and the model's own defaults fill the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from pydantic_core import PydanticUndefined
from sqlalchemy import insert
from sqlmodel import Session, SQLModel

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
    """One INSERT for the rows, in the session's transaction; an autoincrement ``id`` left
    None is filled from the database, in order."""
    table = model.__table__  # type: ignore[attr-defined]
    if rows[0].get("id", "") is None:
        values = [{k: v for k, v in row.items() if k != "id"} for row in rows]
        statement = insert(table).returning(table.c.id, sort_by_parameter_order=True)
        for row, (row_id,) in zip(rows, session.execute(statement, values), strict=True):
            row["id"] = row_id
    else:
        session.execute(insert(table), rows)
