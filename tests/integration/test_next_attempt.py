"""Attempt N+1 through its one constructor, on SQLite and PostgreSQL, with checkpoints on disk.

What a user reads on the next attempt: the checkpoint it resumes from and how (native,
universal or weights, from the ZeRO stage of the save and of the new plan), whether its plan
loads a universal checkpoint, and when a kind's own budget ends the retries. The checkpoint
files are what a complete DeepSpeed save leaves (each ``.pt`` a zip archive, as torch writes).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from sqlmodel import Session

from service.core.advisor import Candidate, advise
from service.core.attempt_kinds import MAX_DISRUPTION_RETRIES, MAX_STOP_RESUMES, AttemptKind
from service.core.clusters import LOCAL_PROFILE
from service.core.failures import FailureClass
from service.core.spec import JobSpec
from service.core.states import AttemptStatus, JobStatus
from service.db import jobs as job_store
from service.db.admission import admit_pending
from service.db.attempts import next_attempt
from service.db.models import Attempt, Job
from service.db.session import get_engine
from service.db.transitions import move_attempt, move_job
from service.db.users import create_user, user_by_token
from service.settings import Settings
from tests.integration.helpers import tiny_spec
from workers.backends.base import BackendState, BackendStatus
from workers.outcomes import run_ended

WORLD = 2  # tiny_spec: one node, two ranks


def plan_at(stage: int) -> Candidate:
    chosen = advise(JobSpec.model_validate(tiny_spec()), LOCAL_PROFILE).plan
    zero = {**chosen.ds_config.get("zero_optimization", {}), "stage": stage}
    return chosen.model_copy(
        update={"zero_stage": stage, "ds_config": {**chosen.ds_config, "zero_optimization": zero}}
    )


def new_job(
    session: Session, settings: Settings, stage: int, owner: str = "alice", **spec: object
) -> Job:
    """A job of tiny_spec planned at ``stage``, admitted, its attempt 1 queued."""
    user = user_by_token(session, create_user(session, owner, f"team-of-{owner}"))
    assert user is not None
    job, _ = job_store.create_job(
        session, spec=JobSpec.model_validate(tiny_spec(**spec)),
        plan=plan_at(stage).model_dump(mode="json"), advice_reason="test", user=user,
        backend="local", idempotency_key=None,
    )  # fmt: skip
    admit_pending(session, settings.cluster_profiles())
    return job


def ended(session: Session, job: Job, ending: AttemptStatus = AttemptStatus.FAILED) -> Attempt:
    """The job's current attempt launched, run and ended (or still RUNNING), the job still
    RUNNING (as the reconcile leaves it when it decides what follows)."""
    attempt = job_store.current_attempt(session, job)
    assert attempt is not None
    move_job(session, job, JobStatus.QUEUED, JobStatus.LAUNCHING, "launching")
    move_job(session, job, JobStatus.LAUNCHING, JobStatus.RUNNING, "running")
    for status in dict.fromkeys((AttemptStatus.LAUNCHING, AttemptStatus.RUNNING, ending)):
        move_attempt(session, attempt, AttemptStatus(attempt.status), status, "on its way")
    return attempt


def saved(settings: Settings, session: Session, job: Job, attempt: Attempt, step: int) -> str:
    """A complete DeepSpeed save of ``attempt`` at ``step``, on disk and reported."""
    stage = int(attempt.plan["zero_stage"])
    folder = settings.data_dir / "jobs" / job.id / "checkpoints" / f"global_step{step}"
    folder.mkdir(parents=True)
    names = ["mp_rank_00_model_states.pt"] if stage < 3 else []
    for rank in range(WORLD if stage > 0 else 0):
        names.append(f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
        if stage == 3:
            names.append(f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt")
    for name in names:
        with zipfile.ZipFile(folder / name, "w") as archive:
            archive.writestr("data.pkl", b"saved")
    job_store.record_checkpoint(session, attempt, step, str(folder), f"global_step{step}")
    return str(folder)


def loads_universal(attempt: Attempt) -> bool:
    return bool(attempt.plan["ds_config"].get("checkpoint", {}).get("load_universal"))


@pytest.mark.parametrize(
    ("before", "after", "method"),
    [(1, 1, "native"), (1, 2, "universal"), (2, 1, "universal"), (0, 1, "weights"),
     (2, 3, "weights"), (3, 2, "weights")],
)  # fmt: skip
def test_the_next_plan_resumes_from_the_newest_checkpoint_as_the_stages_allow(
    settings: Settings, before: int, after: int, method: str
) -> None:
    with Session(get_engine(settings.database_url)) as session:
        job = new_job(session, settings, before)
        first = ended(session, job)
        path = saved(settings, session, job, first, step=10)

        new = next_attempt(
            session, settings.data_dir, job, first, AttemptKind.ESCALATION,
            rung=f"ZeRO-{before} -> ZeRO-{after}", backend="local", plan=plan_at(after),
        )  # fmt: skip
        session.commit()

        second = new.attempt
        assert (second.number, second.kind, second.plan["zero_stage"]) == (2, "escalation", after)
        assert (second.resumed_from, second.resume_method) == (path, method)
        assert new.checkpoint is not None and new.checkpoint.step == 10
        assert loads_universal(second) is (method == "universal")
        reasons = [e.reason for e in job_store.events_of(session, job.id)]
    assert f"attempt 2 planned (ZeRO-{before} -> ZeRO-{after})" in reasons


def test_the_same_plan_after_a_universal_resume_loads_its_own_save_natively(
    settings: Settings,
) -> None:
    with Session(get_engine(settings.database_url)) as session:
        job = new_job(session, settings, 1)
        first = ended(session, job)
        saved(settings, session, job, first, step=10)
        second = next_attempt(
            session, settings.data_dir, job, first, AttemptKind.ESCALATION,
            rung="ZeRO-1 -> ZeRO-2", backend="local", plan=plan_at(2),
        ).attempt  # fmt: skip
        move_job(session, job, JobStatus.RUNNING, JobStatus.ESCALATING, "escalating")
        move_job(session, job, JobStatus.ESCALATING, JobStatus.QUEUED, "queued",
                 current_attempt=2)  # fmt: skip
        ended(session, job, AttemptStatus.FAILED)
        path = saved(settings, session, job, second, step=20)

        third = next_attempt(
            session, settings.data_dir, job, second, AttemptKind.DISRUPTION,
            rung="retry after a disruption (DisruptionTarget)", backend="local",
        ).attempt  # fmt: skip

        assert (second.resume_method, loads_universal(second)) == ("universal", True)
        assert (third.resumed_from, third.resume_method) == (path, "native")
        assert not loads_universal(third)  # its engine loads the ZeRO-2 save as it is
        assert third.plan["zero_stage"] == 2


def test_the_same_plan_before_its_first_save_converts_the_older_stages_save_again(
    settings: Settings,
) -> None:
    with Session(get_engine(settings.database_url)) as session:
        job = new_job(session, settings, 1)
        first = ended(session, job)
        path = saved(settings, session, job, first, step=10)
        second = next_attempt(
            session, settings.data_dir, job, first, AttemptKind.ESCALATION,
            rung="ZeRO-1 -> ZeRO-2", backend="local", plan=plan_at(2),
        ).attempt  # fmt: skip

        third = next_attempt(
            session, settings.data_dir, job, second, AttemptKind.DISRUPTION,
            rung="retry after a disruption (DisruptionTarget)", backend="local",
        ).attempt  # fmt: skip

        assert (third.resumed_from, third.resume_method, third.plan["zero_stage"]) == (
            path, "universal", 2,
        )  # fmt: skip
        assert loads_universal(third)


def test_a_checkpoint_a_rank_did_not_finish_is_passed_over_for_an_older_complete_one(
    settings: Settings,
) -> None:
    with Session(get_engine(settings.database_url)) as session:
        job = new_job(session, settings, 2)
        first = ended(session, job)
        whole = saved(settings, session, job, first, step=10)
        cut = Path(saved(settings, session, job, first, step=20))
        (cut / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()

        new = next_attempt(
            session, settings.data_dir, job, first, AttemptKind.OOM_RETRY,
            rung="retry: other processes held the GPU", backend="local",
        )  # fmt: skip

        assert new.checkpoint is not None and new.checkpoint.step == 10
        assert (new.attempt.resumed_from, new.attempt.resume_method) == (whole, "native")
        assert new.attempt.plan == first.plan


def test_with_resume_off_the_next_attempt_starts_afresh(settings: Settings) -> None:
    with Session(get_engine(settings.database_url)) as session:
        job = new_job(session, settings, 1, checkpoint={"resume": False})
        first = ended(session, job)
        saved(settings, session, job, first, step=10)

        new = next_attempt(
            session, settings.data_dir, job, first, AttemptKind.DISRUPTION,
            rung="retry after a disruption (DisruptionTarget)", backend="local",
        )  # fmt: skip

        assert new.checkpoint is None
        assert (new.attempt.resumed_from, new.attempt.resume_method) == (None, None)


def disrupted(session: Session, settings: Settings, job: Job, failure: FailureClass) -> str | None:
    """The job's current attempt launched, run, and ended by a lost node or a stop from outside:
    what follows, decided and carried out as the reconcile pass does."""
    attempt = ended(session, job, AttemptStatus.RUNNING)
    native = "DisruptionTarget" if failure == FailureClass.NODE_LOST else "PREEMPTED"
    status = BackendStatus(BackendState.FAILED, native_state=native, reason="taken away")
    return run_ended(session, settings, job, attempt, status)


def test_disruptions_and_stops_each_end_at_their_own_budget(settings: Settings) -> None:
    with Session(get_engine(settings.database_url)) as session:
        job = new_job(session, settings, 1)
        disruptions = [
            disrupted(session, settings, job, FailureClass.NODE_LOST)
            for _ in range(MAX_DISRUPTION_RETRIES + 1)
        ]
        stops_job = new_job(session, settings, 1, owner="bob")
        stops = [
            disrupted(session, settings, stops_job, FailureClass.PREEMPTED)
            for _ in range(MAX_STOP_RESUMES + 1)
        ]
        rungs = [a.rung for a in job_store.attempts_of(session, job.id)]
        stopped = job_store.attempts_of(session, stops_job.id)

    assert [d is not None for d in disruptions] == [True] * MAX_DISRUPTION_RETRIES + [False]
    assert job.status == JobStatus.FAILED  # out of retries: the fourth lost node ends it
    assert rungs == ["advisor"] + ["retry after a disruption (DisruptionTarget)"] * 3
    assert [s is not None for s in stops] == [True] * MAX_STOP_RESUMES + [False]
    assert [a.kind for a in stopped] == ["advisor"] + ["stop"] * MAX_STOP_RESUMES
    assert stopped[-1].rung == "resume after a stop (PREEMPTED)"
