"""What follows an attempt's end (service.core.outcomes): one test per row of docs/lifecycle.md."""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import pytest

from service.core.advisor import Candidate
from service.core.attempt_kinds import (
    MAX_DISRUPTION_RETRIES,
    MAX_FAULT_RETRIES,
    MAX_STOP_RESUMES,
    AttemptKind,
)
from service.core.escalation import Decision as Replan
from service.core.failures import FailureClass
from service.core.outcomes import (
    Cancel,
    Elsewhere,
    Ending,
    Escalate,
    Facts,
    Fail,
    FinishedBeforeCancel,
    Phase,
    Replace,
    Requeue,
    Retry,
    Succeed,
    decide,
)

K = AttemptKind
F = FailureClass
PLAN = cast(Candidate, object())  # the decision never looks inside a plan


def not_asked() -> Replan:
    raise AssertionError("the re-plan was asked where no rule needs it")


def no_cluster_asked() -> Elsewhere | str:
    raise AssertionError("another cluster was looked for where no rule needs it")


def facts(
    failure: FailureClass | None = F.USER_ERROR,
    phase: Phase = Phase.RUN,
    kinds: tuple[AttemptKind, ...] = (K.ADVISOR,),
    **changes: object,
) -> Facts:
    ending = Ending(phase, failure is None, failure, summary=f"{failure}: the line")
    made = Facts(
        ending=ending,
        job_cancelled=False,
        stopping_for=None,
        kinds=kinds,
        escalation_enabled=True,
        max_attempts=4,
        evidence="tried 2.0 GiB, 1.0 GiB free",
        replan=not_asked,
        replace=no_cluster_asked,
    )
    return replace(made, **changes)  # type: ignore[arg-type]


def lost(failure: FailureClass) -> Facts:
    made = facts(failure)
    return replace(made, ending=replace(made.ending, lost=True))


# ---- the job was cancelled ----


def test_a_run_that_exited_0_before_the_cancel_reached_it_finished() -> None:
    assert decide(facts(None, job_cancelled=True)) == FinishedBeforeCancel()


@pytest.mark.parametrize("phase", list(Phase))
def test_any_other_end_of_a_cancelled_job_is_cancelled(phase: Phase) -> None:
    assert decide(facts(F.OOM_GPU, phase, job_cancelled=True)) == Cancel(by_cluster=False)


# ---- it ended on its own ----


def test_exit_0_succeeds_even_while_a_stop_for_another_job_was_on_its_way() -> None:
    assert decide(facts(None)) == Succeed()
    assert decide(facts(None, stopping_for="j2")) == Succeed()


@pytest.mark.parametrize("failure", [F.PREEMPTED, F.KILLED, F.OOM_GPU])
def test_stopped_for_another_job_it_goes_back_in_line_whatever_the_class(
    failure: FailureClass,
) -> None:
    assert decide(facts(failure, stopping_for="j2")) == Requeue("j2")


def test_a_lost_node_runs_the_same_plan_again_on_its_own_budget() -> None:
    used = (K.ADVISOR, *[K.DISRUPTION] * (MAX_DISRUPTION_RETRIES - 1))
    assert decide(facts(F.NODE_LOST, kinds=used)) == Retry(K.DISRUPTION)
    spent = (K.ADVISOR, *[K.DISRUPTION] * MAX_DISRUPTION_RETRIES)
    assert decide(facts(F.NODE_LOST, kinds=spent)) == Fail(F.NODE_LOST, "NODE_LOST: the line")


def test_a_stop_from_outside_that_saved_resumes_on_its_own_budget() -> None:
    assert decide(facts(F.PREEMPTED)) == Retry(K.STOP)
    spent = (K.ADVISOR, *[K.STOP] * MAX_STOP_RESUMES)
    assert decide(facts(F.PREEMPTED, kinds=spent)) == Fail(F.PREEMPTED, "PREEMPTED: the line")


@pytest.mark.parametrize("failure", [F.NODE_LOST, F.PREEMPTED])
def test_a_run_deleted_behind_zeropilots_back_is_not_a_disruption(failure: FailureClass) -> None:
    assert decide(lost(failure)) == Fail(failure, f"{failure}: the line")


def test_out_of_memory_escalates_to_the_re_plan() -> None:
    replan = Replan("escalate", "saves 3 GiB", PLAN, "ZeRO-2 -> ZeRO-3")
    outcome = decide(facts(F.OOM_GPU, replan=lambda: replan))
    assert outcome == Escalate(K.ESCALATION, replan)


def test_out_of_memory_caused_by_other_processes_keeps_the_plan() -> None:
    replan = Replan("retry", "other processes held 30 GiB", PLAN)
    assert decide(facts(F.OOM_HOST, replan=lambda: replan)) == Escalate(K.OOM_RETRY, replan)


def test_out_of_memory_with_every_attempt_used_fails_with_the_count() -> None:
    used = (K.ADVISOR, K.ESCALATION, K.DISRUPTION, K.OOM_RETRY, K.PREEMPTION, K.ESCALATION)
    outcome = decide(facts(F.OOM_GPU, kinds=used))  # disruption and preemption are not counted
    assert outcome == Fail(
        F.OOM_GPU, "OOM_GPU: the line; not re-planned: 4 of at most 4 attempts used"
    )


def test_out_of_memory_where_no_plan_fits_fails_with_why_and_the_numbers() -> None:
    stop = Replan("stop", "no plan saves 3.0 GiB")
    outcome = decide(facts(F.OOM_GPU, replan=lambda: stop))
    why = "not re-planned: no plan saves 3.0 GiB (tried 2.0 GiB, 1.0 GiB free)"
    assert outcome == Fail(F.OOM_GPU, f"OOM_GPU: the line; {why}", note=why)


def test_out_of_memory_without_escalation_fails() -> None:
    assert decide(facts(F.OOM_GPU, escalation_enabled=False)) == Fail(
        F.OOM_GPU, "OOM_GPU: the line"
    )


@pytest.mark.parametrize("failure", [F.NCCL_TIMEOUT, F.NCCL_ERROR, F.HANG])
def test_a_failed_collective_or_a_hang_runs_the_same_plan_again_on_its_own_budget(
    failure: FailureClass,
) -> None:
    used = (K.ADVISOR, *[K.FAULT_RETRY] * (MAX_FAULT_RETRIES - 1))
    assert decide(facts(failure, kinds=used)) == Retry(K.FAULT_RETRY)
    spent = (K.ADVISOR, *[K.FAULT_RETRY] * MAX_FAULT_RETRIES)
    assert decide(facts(failure, kinds=spent)) == Fail(failure, f"{failure}: the line")
    assert decide(lost(failure)) == Fail(failure, f"{failure}: the line")


@pytest.mark.parametrize("failure", [F.USER_ERROR, F.TIMEOUT, F.KILLED])
def test_other_failures_fail_with_their_class(failure: FailureClass) -> None:
    assert decide(facts(failure)) == Fail(failure, f"{failure}: the line")


def test_cancelled_on_the_cluster_cancels_the_job() -> None:
    assert decide(facts(F.CANCELLED)) == Cancel(by_cluster=True)


# ---- the launch failed for good ----


def test_a_failed_launch_goes_to_another_cluster_when_one_can_run_it() -> None:
    there = Elsewhere("cpu-b", PLAN, "cpu-b: starts now")
    outcome = decide(facts(F.LAUNCH_ERROR, Phase.LAUNCH, replace=lambda: there))
    assert outcome == Replace(there)


def test_a_failed_launch_fails_with_why_no_other_cluster_can_run_it() -> None:
    why = "no other cluster can run it (cpu-b: the job needs 2 GPUs and zeropilot admits at most 1)"
    outcome = decide(facts(F.LAUNCH_ERROR, Phase.LAUNCH, replace=lambda: why))
    assert outcome == Fail(F.LAUNCH_ERROR, f"LAUNCH_ERROR: the line; {why}")
    # a job that names its cluster has nothing to add
    named = decide(facts(F.LAUNCH_ERROR, Phase.LAUNCH, replace=lambda: ""))
    assert named == Fail(F.LAUNCH_ERROR, "LAUNCH_ERROR: the line")


def test_a_failed_launch_is_not_requeued_for_a_preemptor() -> None:
    outcome = decide(facts(F.LAUNCH_ERROR, Phase.LAUNCH, stopping_for="j2", replace=lambda: ""))
    assert outcome == Fail(F.LAUNCH_ERROR, "LAUNCH_ERROR: the line")
