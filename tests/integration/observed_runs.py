"""Finished runs of different shapes for the advisor to learn from, made through the API and
the state machine (no DeepSpeed): each attempt runs, reports its steps and peaks as rank 0
would, and succeeds; ``learn`` then records them and refits the cluster. What the console's
calibration page and its tests read."""

from __future__ import annotations

from typing import Any

import httpx
from sqlmodel import Session

from service.core.states import AttemptStatus
from service.db.models import Attempt
from service.db.session import get_engine
from service.db.transitions import move_attempt
from service.security import attempt_token
from service.settings import Settings
from tests.integration.helpers import auth, tiny_spec

# (hidden size, sequence length, measured step over the plan's, measured peak over the plan's)
Shape = tuple[int, int, float, float]
SHAPES: list[Shape] = [
    (64, 32, 2.4, 0.80), (96, 32, 2.6, 0.85), (128, 32, 2.5, 0.90),
    (64, 64, 2.7, 0.95), (128, 64, 2.3, 1.02), (96, 64, 2.5, 0.88),
]  # fmt: skip
WARMUP = [6.0, 3.0, 2.0]  # the first steps over the steady one (not learnt from)
STEADY = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01, 0.99]


def shaped_spec(name: str, hidden: int, sequence: int) -> dict[str, Any]:
    spec = tiny_spec(name)
    spec["model"] = {**spec["model"], "hidden_size": hidden}
    spec["training"] = {**spec["training"], "sequence_length": sequence}
    return spec


def submitted(http: httpx.Client, token: str, shape: Shape) -> dict[str, Any]:
    """A job of ``shape``, planned with the constants of the moment."""
    hidden, sequence, _slower, _peak = shape
    spec = shaped_spec(f"shape-{hidden}-{sequence}", hidden, sequence)
    response = http.post("/v1/jobs", json=spec, headers=auth(token))
    assert response.status_code == 201, response.text
    return dict(response.json())


def finished(http: httpx.Client, settings: Settings, job: dict[str, Any], shape: Shape) -> None:
    """The job's attempt runs ``slower`` than its plan said, reports its steps and a peak of
    ``peak_share`` of its plan's, and succeeds."""
    _hidden, sequence, slower, peak_share = shape
    attempt_id = job["attempts"][0]["id"]
    _move(settings, attempt_id, AttemptStatus.QUEUED, AttemptStatus.LAUNCHING)
    _move(settings, attempt_id, AttemptStatus.LAUNCHING, AttemptStatus.RUNNING)
    step_s = job["plan"]["step_seconds"] * slower
    tokens = job["spec"]["training"]["global_batch_size"] * sequence
    peak = int(job["plan"]["per_gpu_bytes"]["total"] * peak_share)
    points = [
        {"step": n, "loss": 1.0, "tokens_per_s": tokens / (step_s * f), "memory_peak_bytes": peak}
        for n, f in enumerate(WARMUP + STEADY, start=1)
    ]
    runtime = auth(attempt_token(settings.secret_key(), attempt_id))
    url = f"/v1/runtime/attempts/{attempt_id}/metrics/batch"
    assert http.post(url, json=points, headers=runtime).status_code == 200
    _move(settings, attempt_id, AttemptStatus.RUNNING, AttemptStatus.SUCCEEDED)


def _move(settings: Settings, attempt_id: str, old: AttemptStatus, new: AttemptStatus) -> None:
    with Session(get_engine(settings.database_url)) as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        exited = {"exit_code": 0} if new == AttemptStatus.SUCCEEDED else {}
        assert move_attempt(session, attempt, old, new, f"to {new}", **exited)
        session.commit()
