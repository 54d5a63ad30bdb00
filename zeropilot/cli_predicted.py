"""A waiting job's predicted start and end as `zeropilot status` and `zeropilot list` show them,
and a started job's error against its first prediction (docs/scheduling.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def prediction_lines(job: dict[str, Any], now: datetime | None = None) -> list[str]:
    """What `status` prints: for a waiting job its prediction, for a started one the error."""
    now = now or datetime.now(UTC)
    if job["status"] == "PENDING" and job.get("prediction_basis"):
        start, end = _at(job.get("predicted_start_at")), _at(job.get("predicted_end_at"))
        made = _at(job.get("predicted_at"))
        lines = [f"predicted start: {_when(start, now)}, end: {_when(end, now)}"]
        lines.append(f"  rests on: {job['prediction_basis']}")
        if made is not None:
            lines.append(f"  predicted at {_clock(made)} ({_span(now - made)} ago)")
        return lines
    error = job.get("start_prediction_error_s")
    if error is None:
        return []
    late = "late" if error >= 0 else "early"
    first = _at(job.get("first_predicted_start_at"))
    against = f" against its first prediction, {_clock(first)}" if first else ""
    return [f"started {_span_s(abs(error))} {late}{against}"]


def start_cell(job: dict[str, Any]) -> str:
    """The list's column: a waiting job's predicted start ("?" when not known)."""
    if job["status"] != "PENDING" or not job.get("prediction_basis"):
        return "-"
    start = _at(job.get("predicted_start_at"))
    return _clock(start) if start is not None else "?"


def _at(text: str | None) -> datetime | None:
    if not text:
        return None
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _when(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "not known"
    ahead = moment - now
    distance = f"in {_span(ahead)}" if ahead.total_seconds() > 0 else "now"
    return f"{_clock(moment)} ({distance})"


def _clock(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def _span(delta: Any) -> str:
    return _span_s(abs(delta.total_seconds()))


def _span_s(seconds: float) -> str:
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"
