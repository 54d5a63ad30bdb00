"""A report's start, as people write it: ``7d``, ``12h``, ``30m`` ago, or a date and time."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_UNITS = {"d": timedelta(days=1), "h": timedelta(hours=1), "m": timedelta(minutes=1)}
_AGO = re.compile(r"^(\d{1,5})([dhm])$")


def parse_since(text: str, now: datetime) -> datetime:
    """``7d`` (days), ``12h``, ``30m`` before ``now``, or an ISO 8601 time (UTC if no zone);
    ValueError naming the forms otherwise."""
    text = text.strip()
    if found := _AGO.match(text):
        return now - int(found[1]) * _UNITS[found[2]]
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"since={text!r}: give a span back from now (7d, 12h, 30m) or an ISO 8601 time"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
