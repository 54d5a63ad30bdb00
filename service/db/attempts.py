"""Attempt N+1: the one constructor every recovery uses, and the checkpoint it resumes from.

An escalation, a retry of the same plan, a disruption, a stop, a preemption and a re-placement
each make the next attempt here: the newest checkpoint complete on disk, how the new plan loads
it (the ZeRO stages of the plan that saved it and of the new one decide), the plan as its engine
must be built to load it, the attempt row and its event. Whether a job may have one more attempt
of a kind is ``service.core.attempt_kinds``'s table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from sqlmodel import Session

from service import checkpoint_files
from service.checkpoint_paths import job_fence
from service.core.advisor import Candidate
from service.core.attempt_kinds import AttemptKind
from service.core.spec import JobSpec
from service.db.jobs import add_attempt, attempts_of, kept_checkpoints
from service.db.models import Attempt, Checkpoint, Job
from service.db.users import checkpoint_roots_of
from zeropilot.resume import ResumeMethod

log = logging.getLogger(__name__)

NEWEST: Final = "newest"  # next_attempt's default: it chooses the checkpoint itself


@dataclass(frozen=True)
class NextAttempt:
    attempt: Attempt
    checkpoint: Checkpoint | None  # what it resumes from; None: from the start


def next_attempt(
    session: Session,
    data_dir: Path,
    job: Job,
    ended: Attempt,
    kind: AttemptKind,
    *,
    rung: str,
    backend: str,
    plan: Candidate | None = None,
    checkpoint: Checkpoint | Literal["newest"] | None = NEWEST,
) -> NextAttempt:
    """Add attempt N+1 after ``ended``: ``plan`` (None: ``ended``'s again) on a ``backend``
    cluster, resuming from ``checkpoint`` (by default the newest complete one, when the spec
    resumes); ``rung`` says why, in a person's words."""
    if checkpoint == NEWEST:
        checkpoint = resume_checkpoint(session, data_dir, job)
    planned = plan.model_dump(mode="json") if plan is not None else ended.plan
    method = None
    if checkpoint is not None:
        method = resume_method(_stage(_saved_by(session, checkpoint, ended).plan), _stage(planned))
    new = add_attempt(
        session, job, kind=kind, number=ended.number + 1, plan=loading(planned, method),
        rung=rung, backend=backend, resumed_from=checkpoint.path if checkpoint else None,
        resume_method=method,
    )  # fmt: skip
    return NextAttempt(new, checkpoint)


def resume_method(before_stage: int, after_stage: int) -> ResumeMethod:
    """How a plan at ``after_stage`` loads a checkpoint saved at ``before_stage``
    (see zeropilot.runtime.ResumePoint).

    Native when the ZeRO partitioning is unchanged. Between ZeRO-1 and 2, DeepSpeed's universal
    checkpoint re-partitions the fp32 weights and optimizer states. DeepSpeed 0.19.8 cannot load
    a universal checkpoint of a ZeRO-1/2 run into ZeRO-3 (its stage-3 loader wants its own
    optimizer file) and keeps no optimizer partitions at ZeRO-0 to convert (both measured), so
    those resume from the consolidated weights with a fresh optimizer.
    """
    if before_stage == after_stage:
        return ResumeMethod.NATIVE
    if {before_stage, after_stage} <= {1, 2}:
        return ResumeMethod.UNIVERSAL
    return ResumeMethod.WEIGHTS


def loading(plan: dict[str, Any], method: ResumeMethod | None) -> dict[str, Any]:
    """The plan with its engine built to load by ``method``: a universal checkpoint needs
    ``checkpoint.load_universal``, any other must not have it (a plan carried over from a
    universal resume loads its own native checkpoint next)."""
    ds_config = dict(plan["ds_config"])
    section = {k: v for k, v in ds_config.pop("checkpoint", {}).items() if k != "load_universal"}
    if method == ResumeMethod.UNIVERSAL:
        section = {"load_universal": True}
    if section:
        ds_config["checkpoint"] = section
    return {**plan, "ds_config": ds_config}


def resume_checkpoint(session: Session, data_dir: Path, job: Job) -> Checkpoint | None:
    """The checkpoint the job's next attempt resumes from: the newest that is complete on disk
    now, or None (also when the spec says not to resume). A reported checkpoint whose ranks did
    not all save (or that lost files since) is never resumed."""
    spec = JobSpec.model_validate(job.spec)
    roots = checkpoint_roots_of(session, job.team_id)
    fence = job_fence(data_dir, job.id, job.spec, roots) if spec.checkpoint.resume else None
    if fence is None:
        return None
    attempts = {a.id: a for a in attempts_of(session, job.id)}
    for row in reversed(kept_checkpoints(session, job.id)):
        attempt = attempts.get(row.attempt_id)
        stage = _stage(attempt.plan) if attempt else 0
        found = checkpoint_files.inspect(fence, row.path, stage, spec.resources.world_size)
        if found.complete:
            return row
        log.warning("not resuming from %s: incomplete (%s)", row.path, found.why)
    return None


def failed_launch_clusters(attempts: Iterable[Attempt]) -> set[str]:
    """The clusters where a launch of these attempts failed for good: never chosen again."""
    return {a.launch_cluster for a in attempts if a.launch_cluster}


def _saved_by(session: Session, checkpoint: Checkpoint, ended: Attempt) -> Attempt:
    """The attempt that saved ``checkpoint``: its plan's stage is the one to convert from."""
    return session.get(Attempt, checkpoint.attempt_id) or ended


def _stage(plan: dict[str, Any]) -> int:
    return int(plan.get("zero_stage", 0))
