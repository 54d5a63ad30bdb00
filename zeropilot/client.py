"""A small Python client for the zeropilot HTTP API (what the CLI uses)."""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from typing import Any, cast
from urllib.parse import quote

from zeropilot.transport import (
    CannotConnect,
    NoAnswerInTime,
    Response,
    Transport,
    TransportError,
)

DEFAULT_URL = "http://127.0.0.1:8321"
SUBMIT_TRIES = 5
READ_TRIES = 4  # a read (GET) changes nothing, so a lost connection or a 503 is read again
BACKOFF_S = (1, 2, 4, 8)  # waits after a lost connection; a 503's Retry-After comes first
RETRY_AFTER_MAX_S = 60.0  # a longer Retry-After is not worth holding a terminal for

# (why, seconds until the next try, its number, of how many): e.g. to print a progress line.
OnRetry = Callable[[str, float, int, int], None]


class ApiError(Exception):
    """The API answered with an error status; ``detail`` is its explanation."""

    def __init__(self, status_code: int, detail: Any, retry_after: str | None = None) -> None:
        super().__init__(f"HTTP {status_code}: {format_detail(detail)}")
        self.status_code = status_code
        self.detail = detail
        self.retry_after = retry_after  # the Retry-After header, if the answer had one


class GaveUp(Exception):
    """Every try of a request the server may have stored failed; ``reason`` says the last."""

    def __init__(self, reason: str, tries: int, idempotency_key: str, maybe_stored: bool) -> None:
        super().__init__(f"{reason}; gave up after {tries} tries")
        self.reason = reason
        self.tries = tries
        self.idempotency_key = idempotency_key
        self.maybe_stored = maybe_stored  # False: no try ever reached the server


def format_detail(detail: Any) -> str:
    """FastAPI validation errors as "field.path: message" lines; anything else as text."""
    if isinstance(detail, list):
        lines = []
        for item in detail:
            loc = ".".join(str(p) for p in item.get("loc", []) if p != "body")
            lines.append(f"{loc}: {item.get('msg', item)}" if loc else str(item.get("msg", item)))
        return "\n".join(lines)
    return str(detail)


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0):
        self.url = (url or os.environ.get("ZEROPILOT_URL") or DEFAULT_URL).rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = Transport(self.url, headers, timeout)

    def close(self) -> None:
        """Close the kept-alive connections (they also close when the client is collected)."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def submit(
        self,
        spec: dict[str, Any],
        idempotency_key: str | None = None,
        tries: int = SUBMIT_TRIES,
        on_retry: OnRetry | None = None,
    ) -> dict[str, Any]:
        """Store a job. A lost connection or a 503 sends it again with the same
        Idempotency-Key, so a try the server stored before its answer was lost returns that
        job instead of a second one; raises ``GaveUp`` when the last try fails too."""
        key = idempotency_key or str(uuid.uuid4())
        maybe_stored = False
        for number in range(1, tries + 1):
            try:
                return self._call(
                    "POST", "/v1/jobs", json_body=spec, headers={"Idempotency-Key": key}
                )
            except (ApiError, TransportError) as exc:
                reason = self._retry_reason(exc)
                if reason is None:
                    raise  # an answer to act on (a refusal, a conflict), not an outage
                maybe_stored |= not isinstance(exc, TransportError) or exc.may_have_arrived
                if number == tries:
                    raise GaveUp(reason, tries, key, maybe_stored) from exc
                delay = retry_delay(exc, number)
                if on_retry is not None:
                    on_retry(reason, delay, number + 1, tries)
                time.sleep(delay)
        raise ValueError(f"tries must be at least 1, not {tries}")

    def _retry_reason(self, exc: Exception) -> str | None:
        """Why a try may be sent again, or None when its answer is final."""
        if isinstance(exc, ApiError):
            if exc.status_code != 503:
                return None
            text = format_detail(exc.detail)
            return "database unavailable" if "database" in text else "service unavailable (503)"
        if isinstance(exc, TransportError) and not exc.worth_retrying:
            return None  # this side's mistake or a refused certificate: the same again
        if isinstance(exc, CannotConnect):
            return f"cannot connect to {self.url}"
        if isinstance(exc, NoAnswerInTime):
            return f"no answer from {self.url} in time"
        return f"connection to {self.url} lost before the answer"

    def list_jobs(
        self, status: str | None = None, limit: int = 50, offset: int = 0
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if status:
            params["status"] = status
        return self._call("GET", "/v1/jobs", params=params)

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{_segment(job_id)}")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{_segment(job_id)}/cancel")

    def logs(
        self, job_id: str, tail: int = 200, offset: int | None = None, attempt: int | None = None
    ) -> tuple[str, int | None]:
        params: dict[str, Any] = {"tail": tail}
        if offset is not None:
            params["offset"] = offset
        if attempt is not None:
            params["attempt"] = attempt
        response = self._send("GET", f"/v1/jobs/{_segment(job_id)}/logs", params=params)
        next_offset = response.headers.get("X-Next-Offset")
        return response.json()["text"], int(next_offset) if next_offset else None

    def metrics(self, job_id: str, after_id: int = 0) -> list[dict[str, Any]]:
        path = f"/v1/jobs/{_segment(job_id)}/metrics"
        response = self._send("GET", path, params={"after_id": after_id})
        return cast(list[dict[str, Any]], response.json())

    def wait(
        self,
        job_id: str,
        status: str | None = None,
        events_after: int = 0,
        metrics_after: int = 0,
        timeout_s: float = 20.0,
    ) -> dict[str, Any]:
        """Held by the server until the job moves past what was seen, or ``timeout_s``."""
        params: dict[str, Any] = {
            "events_after": events_after,
            "metrics_after": metrics_after,
            "timeout_s": timeout_s,
        }
        if status is not None:
            params["status"] = status
        return self._call("GET", f"/v1/jobs/{_segment(job_id)}/wait", params=params)

    def advise(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/advice", json_body=spec)

    def me(self) -> dict[str, Any]:
        return self._call("GET", "/v1/me")

    def create_user(
        self, name: str, team: str, is_admin: bool = False, role: str = "member"
    ) -> dict[str, Any]:
        body = {"name": name, "team": team, "is_admin": is_admin, "role": role}
        return self._call("POST", "/v1/users", json_body=body)

    def teams(self) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], self._send("GET", "/v1/teams").json())

    def team_report(self, name: str, since: str) -> dict[str, Any]:
        path = f"/v1/teams/{_segment(name)}/report"
        return self._call("GET", path, params={"since": since})

    def update_team(self, name: str, **fields: Any) -> dict[str, Any]:
        return self._call("PATCH", f"/v1/teams/{_segment(name)}", json_body=fields)

    def calibration(self, cluster: str, tries: int = READ_TRIES) -> dict[str, Any]:
        """``tries=1``: one try, for a caller that carries on without the server."""
        path = f"/v1/clusters/{_segment(cluster)}/calibration"
        return cast(dict[str, Any], self._send("GET", path, tries=tries).json())

    def freeze_calibration(self, cluster: str, frozen: bool) -> dict[str, Any]:
        path = f"/v1/clusters/{_segment(cluster)}/calibration"
        return self._call("PATCH", path, json_body={"frozen": frozen})

    def import_calibration(self, cluster: str, exported: dict[str, Any]) -> dict[str, Any]:
        path = f"/v1/clusters/{_segment(cluster)}/calibration"
        return self._call("PUT", path, json_body=exported)

    def reset_calibration(self, cluster: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/clusters/{_segment(cluster)}/calibration")

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        return cast(dict[str, Any], self._send(method, path, **kwargs).json())

    def _send(self, method: str, path: str, tries: int | None = None, **kwargs: Any) -> Response:
        """One request; a read is tried again after a lost connection or a 503 (honouring
        Retry-After), up to ``READ_TRIES`` in all (or ``tries``). A write is sent once: only
        ``submit`` knows how to send one again safely (its Idempotency-Key)."""
        tries = tries or (READ_TRIES if method == "GET" else 1)
        for number in range(1, tries + 1):
            try:
                return self._send_once(method, path, **kwargs)
            except (ApiError, TransportError) as exc:
                if number == tries or self._retry_reason(exc) is None:
                    raise
                time.sleep(retry_delay(exc, number))
        raise AssertionError("unreachable: the last try returns or raises")

    def _send_once(self, method: str, path: str, **kwargs: Any) -> Response:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                parsed = response.json()
            except ValueError:
                parsed = None
            detail = parsed.get("detail", response.text) if isinstance(parsed, dict) else None
            retry_after = response.headers.get("Retry-After")
            raise ApiError(response.status_code, detail or response.text, retry_after)
        return response


def _segment(value: str) -> str:
    """A name or id as one path segment: a slash or a space in it cannot reach another route."""
    return quote(value, safe="")


def retry_delay(exc: Exception, number: int) -> float:
    """Seconds before the next try: the server's Retry-After (seconds or an HTTP date), else
    the backoff for this try's number."""
    backoff = float(BACKOFF_S[min(number, len(BACKOFF_S)) - 1])
    hint = exc.retry_after if isinstance(exc, ApiError) else None
    if not hint:
        return backoff
    try:
        seconds = float(hint)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(hint).timestamp() - time.time()
        except (TypeError, ValueError):
            return backoff
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S) if math.isfinite(seconds) else backoff
