"""Re-placing a ``cluster: auto`` job whose launch failed for good: the next best cluster gets
it, with a plan made for that cluster, resuming from its checkpoint where storage allows.

``service.core.outcomes`` decides that the job moves; this finds where (through the one
placement entry) and moves it. The job goes back to PENDING on the new cluster (its GPUs on
the old one released, the new cluster's admission starts it), with a new attempt that counts
against no budget of the user's. Clusters where a launch of it failed are never chosen again,
and a job with checkpoints moves only between clusters that mount the same storage
(``ClusterProfile.storage``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session

from service.core.attempt_kinds import AttemptKind
from service.core.outcomes import Elsewhere
from service.core.placement import AUTO
from service.core.spec import JobSpec
from service.core.states import JobStatus
from service.db.admission import WAITING_PREFIX
from service.db.attempts import failed_launch_clusters, next_attempt, resume_checkpoint
from service.db.jobs import attempts_of
from service.db.models import Attempt, Checkpoint, Job, Team, User, utcnow
from service.db.placing import Moving, place
from service.db.transitions import move_job
from service.db.users import Caller
from service.settings import Settings


@dataclass(frozen=True)
class Relocation:
    """Where placement would move the job, or why nowhere ("" for a job that names its
    cluster: nothing to add), and the checkpoint that choice assumed it resumes from."""

    elsewhere: Elsewhere | str
    checkpoint: Checkpoint | None = None


def another_cluster(session: Session, settings: Settings, job: Job) -> Relocation:
    """The best other cluster for a job whose launch failed for good (the placement entry's
    choice, never a cluster where a launch of it failed)."""
    spec = JobSpec.model_validate(job.spec)
    if spec.resources.cluster != AUTO:
        return Relocation("")
    user, team = session.get(User, job.user_id), session.get(Team, job.team_id)
    if user is None or team is None:
        return Relocation("its user or team is gone")
    failed = failed_launch_clusters(attempts_of(session, job.id)) | {job.cluster}
    checkpoint = resume_checkpoint(session, settings.data_dir, job)
    moving = Moving(
        job.id, job.cluster, frozenset(failed), checkpoint is not None,
        holds_gpus=True,  # still LAUNCHING there: its GPUs count as held until it moves
    )  # fmt: skip
    placed = place(session, spec, settings.cluster_profiles(), Caller.of(user, team),
                   borrowing=settings.scheduling.borrowing, moving=moving)  # fmt: skip
    chosen = placed.chosen
    if chosen is None or chosen.advice is None:
        return Relocation(f"no other cluster can run it ({placed.ruled_out()})")
    return Relocation(Elsewhere(chosen.cluster, chosen.advice.plan, placed.summary()), checkpoint)


def move_elsewhere(
    session: Session, settings: Settings, job: Job, attempt: Attempt, relocation: Relocation,
    error: str,
) -> None:  # fmt: skip
    """Back to PENDING on the chosen cluster with attempt N+1 planned for it."""
    there, checkpoint = relocation.elsewhere, relocation.checkpoint
    assert isinstance(there, Elsewhere)
    before = job.cluster
    new = next_attempt(
        session, settings.data_dir, job, attempt, AttemptKind.REPLACEMENT,
        rung=f"re-placed on {there.cluster} after the launch on {before} failed",
        backend=settings.cluster_profiles()[there.cluster].kind, plan=there.plan,
        checkpoint=checkpoint,
    ).attempt  # fmt: skip
    where = (
        f", from the step-{checkpoint.step} checkpoint ({new.resume_method})" if checkpoint else ""
    )
    moved = move_job(
        session, job, JobStatus.LAUNCHING, JobStatus.PENDING,
        f"launch on {before} failed ({error[:300]}); attempt {new.number} re-placed on"
        f" {there.cluster}{where}: {there.words}",
        current_attempt=new.number, plan=new.plan,
        message=f"{WAITING_PREFIX}re-placed on {there.cluster} after the launch on {before}"
        " failed; admission starts it there",
    )  # fmt: skip
    if moved:
        job.cluster = there.cluster  # PENDING holds no GPUs: the new cluster's count is untouched
        job.placed_at = utcnow()  # a move: the waiting re-placement lets it settle first
        session.add(job)
