"""A linter finding: how bad, which key, why in one sentence, and what to do."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


class Finding(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    severity: Severity
    key: str  # dotted path in the ds_config, e.g. "zero_optimization.reduce_bucket_size"
    reason: str
    fix: str


def error(key: str, reason: str, fix: str) -> Finding:
    return Finding(severity="error", key=key, reason=reason, fix=fix)


def warning(key: str, reason: str, fix: str) -> Finding:
    return Finding(severity="warning", key=key, reason=reason, fix=fix)


def info(key: str, reason: str, fix: str) -> Finding:
    return Finding(severity="info", key=key, reason=reason, fix=fix)
