"""Structured logs: JSON lines (when configured) that carry the request, job and attempt ids.

The ids live in context variables: the API sets the request id per HTTP request (and passes it
to the Celery tasks it sends, in a message header), the workers set it back with the attempt id
(and job id, once known) for the task they run. Every log record then carries them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime

request_id: ContextVar[str | None] = ContextVar("zeropilot_request_id", default=None)
job_id: ContextVar[str | None] = ContextVar("zeropilot_job_id", default=None)
attempt_id: ContextVar[str | None] = ContextVar("zeropilot_attempt_id", default=None)
_IDS = {"request_id": request_id, "job_id": job_id, "attempt_id": attempt_id}
REQUEST_ID_HEADER = "zeropilot_request_id"  # the Celery message header that carries it


class ContextIds(logging.Filter):
    """Copies the current ids onto each record (text formats may use %(request_id)s)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, var in _IDS.items():
            if not hasattr(record, name):
                setattr(record, name, var.get())
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ids that are not set are left out."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, var in _IDS.items():
            value = getattr(record, name, None) or var.get()
            if value:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def use_json(handler: logging.Handler) -> None:
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextIds())


def configure_logging(fmt: str, level: str) -> None:
    """With ``fmt`` 'json', send the root logger's records to stderr as JSON lines (once per
    process); with 'text', leave logging as the server (uvicorn, Celery) set it up."""
    root = logging.getLogger()
    if fmt != "json" or any(getattr(h, "zeropilot", False) for h in root.handlers):
        return
    root.setLevel(level)
    handler = logging.StreamHandler()
    handler.zeropilot = True  # type: ignore[attr-defined]
    use_json(handler)
    root.addHandler(handler)


@contextmanager
def bound(**ids: str | None) -> Iterator[None]:
    """Set some of the ids for the duration of a block (a task, a request)."""
    tokens = [(_IDS[name], _IDS[name].set(value)) for name, value in ids.items()]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)
