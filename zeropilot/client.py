"""A small Python client for the zeropilot HTTP API (what the CLI uses)."""

from __future__ import annotations

import os
from typing import Any, cast

import httpx

DEFAULT_URL = "http://127.0.0.1:8321"


class ApiError(Exception):
    """The API answered with an error status; ``detail`` is its explanation."""

    def __init__(self, status_code: int, detail: Any) -> None:
        super().__init__(f"HTTP {status_code}: {format_detail(detail)}")
        self.status_code = status_code
        self.detail = detail


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
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._call("POST", "/v1/jobs", json=spec, headers=headers)

    def list_jobs(
        self, status: str | None = None, limit: int = 50, offset: int = 0
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if status:
            params["status"] = status
        return self._call("GET", "/v1/jobs", params=params)

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    def logs(
        self, job_id: str, tail: int = 200, offset: int | None = None, attempt: int | None = None
    ) -> tuple[str, int | None]:
        params: dict[str, Any] = {"tail": tail}
        if offset is not None:
            params["offset"] = offset
        if attempt is not None:
            params["attempt"] = attempt
        response = self._send("GET", f"/v1/jobs/{job_id}/logs", params=params)
        next_offset = response.headers.get("X-Next-Offset")
        return response.json()["text"], int(next_offset) if next_offset else None

    def metrics(self, job_id: str, after_id: int = 0) -> list[dict[str, Any]]:
        response = self._send("GET", f"/v1/jobs/{job_id}/metrics", params={"after_id": after_id})
        return cast(list[dict[str, Any]], response.json())

    def advise(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/advice", json=spec)

    def me(self) -> dict[str, Any]:
        return self._call("GET", "/v1/me")

    def create_user(
        self, name: str, team: str, is_admin: bool = False, role: str = "member"
    ) -> dict[str, Any]:
        body = {"name": name, "team": team, "is_admin": is_admin, "role": role}
        return self._call("POST", "/v1/users", json=body)

    def teams(self) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], self._send("GET", "/v1/teams").json())

    def update_team(self, name: str, **fields: Any) -> dict[str, Any]:
        return self._call("PATCH", f"/v1/teams/{name}", json=fields)

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        return cast(dict[str, Any], self._send(method, path, **kwargs).json())

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ApiError(response.status_code, detail)
        return response
