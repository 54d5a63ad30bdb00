"""A job's goodput and MFU as its detail shows them (``GET /v1/jobs/{id}``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlmodel import Session

from service.api.schemas import AttemptGoodputPublic, JobGoodputPublic
from service.core.clusters import ClusterProfile
from service.core.goodput import LOST_CAUSES, Tally, tally
from service.core.mfu import job_mfu
from service.core.spec import JobSpec
from service.db.goodput import job_timeline
from service.db.models import Job


def tally_fields(counted: Tally) -> dict[str, Any]:
    return {
        "gpu_seconds": round(counted.held, 3),
        "productive_gpu_seconds": round(counted.productive, 3),
        "goodput": counted.goodput,
        "lost_gpu_seconds": {c.value: round(counted.by_cause[c], 3) for c in LOST_CAUSES},
    }


def job_goodput(
    session: Session, job: Job, profiles: Mapping[str, ClusterProfile]
) -> JobGoodputPublic | None:
    """None until the job has held GPUs (as the submit answers it)."""
    timeline = job_timeline(session, job)
    if not timeline.segments:
        return None
    numbers = sorted({piece.attempt for piece in timeline.segments})
    attempts = [
        AttemptGoodputPublic(
            number=number,
            **tally_fields(tally(p for p in timeline.segments if p.attempt == number)),
        )
        for number in numbers
    ]
    profile = profiles.get(job.cluster)
    spec = JobSpec.model_validate(job.spec)
    mfu = job_mfu(spec, profile, timeline.tokens_per_s) if profile else None
    return JobGoodputPublic(
        **tally_fields(tally(timeline.segments)),
        mfu=mfu,
        tokens_per_s=timeline.tokens_per_s,
        attempts=attempts,
    )
