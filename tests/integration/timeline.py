"""Rows of a job written through the real database with chosen times (goodput, cadence)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlmodel import Session

from service.core.attempt_kinds import AttemptKind
from service.core.states import AttemptStatus
from service.db import jobs as job_store
from service.db.attempts import next_attempt
from service.db.models import Attempt, Checkpoint, Job
from service.db.transitions import move_attempt

TOKENS_PER_STEP = 8 * 32  # tiny_spec's global batch x sequence length: 256 tokens/s is 1 s/step


class Timeline:
    """Rows of one job written with chosen times: seconds after ``t0``."""

    def __init__(self, session: Session, job: Job, t0: datetime, data_dir: Path) -> None:
        self.session, self.job, self.t0, self.data_dir = session, job, t0, data_dir

    def at(self, seconds: float) -> datetime:
        return self.t0 + timedelta(seconds=seconds)

    def run(self, attempt: Attempt, started: float) -> None:
        move_attempt(self.session, attempt, AttemptStatus.QUEUED, AttemptStatus.LAUNCHING, "")
        running = AttemptStatus.RUNNING
        move_attempt(
            self.session, attempt, AttemptStatus.LAUNCHING, running, "", started_at=self.at(started)
        )

    def step(self, attempt: Attempt, step: int, reported: float) -> None:
        point = job_store.record_metric(
            self.session, attempt, {"step": step, "tokens_per_s": TOKENS_PER_STEP, "extra": {}}
        )
        point.created_at = self.at(reported)
        self.session.add(point)

    def save(self, attempt: Attempt, step: int, written: float, seconds: float) -> Checkpoint:
        path = f"/data/jobs/{self.job.id}/checkpoints/global_step{step}"
        row = job_store.record_checkpoint(self.session, attempt, step, path, None, seconds)
        row.created_at, row.complete = self.at(written), True
        self.session.add(row)
        return row

    def end(self, attempt: Attempt, status: AttemptStatus, at: float, **fields: Any) -> None:
        move_attempt(
            self.session, attempt, AttemptStatus.RUNNING, status, "", finished_at=self.at(at),
            **fields,
        )  # fmt: skip

    def then(self, ended: Attempt, kind: AttemptKind, resume: Checkpoint) -> Attempt:
        made = next_attempt(
            self.session, self.data_dir, self.job, ended, kind, rung=kind.value,
            backend="local", checkpoint=resume,
        )  # fmt: skip
        return made.attempt
