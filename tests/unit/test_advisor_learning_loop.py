"""The pure pieces of the learning loop: the steady-step rule, when to refit, a stored
calibration made whole again, a stored plan rebuilt, and plans that say how they were priced."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.core.advice_memo import advise_once
from service.core.advisor import advise
from service.core.advisor.calibration import ClusterCalibration, fit, restored
from service.core.advisor.calibration_memory import MemoryCorrection
from service.core.advisor.constants import CALIBRATION
from service.core.advisor.step_time import predict_step_time
from service.core.clusters import LOCAL_PROFILE
from service.core.observing import measure, observation_of, peak_kind, refit_due
from service.core.spec import JobSpec
from service.core.states import AttemptStatus
from tests.unit.test_advisor_learning import plans, synthetic
from zeropilot.cli_calibration import summary

SPEC: dict[str, Any] = {
    "name": "learn",
    "entrypoint": "train.py",
    "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 128},
    "training": {"sequence_length": 32, "global_batch_size": 8, "precision": "fp32"},
    "resources": {"cluster": "local", "nodes": 1, "gpus_per_node": 2},
}
TOKENS = 8 * 32  # per step: global batch x sequence
SUCCEEDED = AttemptStatus.SUCCEEDED


def spec() -> JobSpec:
    return JobSpec.model_validate(SPEC)


def paces(seconds: list[float]) -> list[float | None]:
    return [TOKENS / s for s in seconds]


def test_the_steady_step_leaves_out_three_warm_up_steps_and_takes_the_median() -> None:
    measured = measure(SUCCEEDED, spec(), paces([2.0, 1.0, 0.5, 0.2, 0.21, 0.19, 0.3, 0.2]))

    assert measured.step_seconds == pytest.approx(0.2)
    assert (measured.steady_steps, measured.skipped) == (5, "")


def test_fewer_than_five_steady_steps_or_a_failed_attempt_teach_nothing() -> None:
    short = measure(SUCCEEDED, spec(), [*paces([2.0, 1.0, 0.5, 0.2, 0.2, 0.2, 0.2]), None])
    failed = measure(AttemptStatus.FAILED, spec(), paces([0.2] * 20))
    stopped = measure(AttemptStatus.PREEMPTED, spec(), paces([0.2] * 20))

    assert short.step_seconds is None
    assert short.skipped == "7 steps with a pace reported, 8 needed"
    assert failed.step_seconds is None and "FAILED attempt is not learnt from" in failed.skipped
    assert stopped.step_seconds == pytest.approx(0.2)  # stopped after saving: its steps count


def test_the_peak_is_resident_on_cpu_ranks_and_reserved_only_where_reported() -> None:
    assert peak_kind(on_cpu=True, reserved=True) == "resident"
    assert peak_kind(on_cpu=False, reserved=False) == "allocated"
    assert peak_kind(on_cpu=False, reserved=True) == "reserved"


def test_a_refit_waits_for_five_new_runs_or_a_day() -> None:
    now = datetime(2026, 12, 4, tzinfo=UTC)
    fitted = now - timedelta(hours=1)

    assert refit_due(5, 5, None, now)
    assert not refit_due(4, 5, None, now)  # the first fit waits for five
    assert not refit_due(4, 5, fitted, now)
    assert refit_due(1, 5, now - timedelta(days=1), now)
    assert not refit_due(0, 5, now - timedelta(days=3), now)


def test_a_stored_calibration_predicts_what_the_fit_did() -> None:
    fitted = fit(synthetic())
    memory = MemoryCorrection(gpu_share=0.1, cpu_share=0.2)

    stored = restored(fitted.multipliers, memory, fitted.observations, fitted.typical_error)

    for work, lay in plans():
        seconds = predict_step_time(work, lay, stored.constants).seconds
        assert seconds == pytest.approx(predict_step_time(work, lay, fitted.constants).seconds)
    overhead = stored.constants.overhead
    assert overhead.gpu_reserved_per_transient == pytest.approx(
        CALIBRATION.overhead.gpu_reserved_per_transient + 0.1
    )
    assert overhead.cpu_fragmentation == pytest.approx(CALIBRATION.overhead.cpu_fragmentation + 0.2)


def test_a_stored_plan_rebuilt_predicts_what_it_said() -> None:
    advice = advise(spec(), LOCAL_PROFILE)

    rebuilt = observation_of("a1", spec(), advice.plan, LOCAL_PROFILE, 0.2)

    predicted = predict_step_time(rebuilt.work, rebuilt.layout).seconds
    assert predicted == pytest.approx(advice.plan.step_seconds, abs=1e-6)  # stored to 1 µs
    assert rebuilt.predicted_step_seconds == advice.plan.step_seconds


def slower_host(runs: int) -> ClusterCalibration:
    """A cluster whose host takes 9 times today's per block pass."""
    multipliers = {"host_seconds_per_block_pass": 9.0}
    return restored(multipliers, MemoryCorrection(), runs, 0.06)


def test_the_reason_says_whether_and_on_how_many_runs_the_step_is_calibrated() -> None:
    today = advise(spec(), LOCAL_PROFILE, calibration=ClusterCalibration(CALIBRATION))
    calibrated = advise(spec(), LOCAL_PROFILE, calibration=slower_host(37))

    assert today.reason.endswith("from the advisor's constants (not calibrated here yet).")
    ms = round(calibrated.plan.step_seconds * 1000)
    assert calibrated.reason.endswith(
        f"Step {ms} ms predicted, calibrated on 37 runs of this cluster, typical error 6%."
    )
    assert calibrated.plan.step_seconds > 3 * today.plan.step_seconds  # host-bound: it follows
    imported = restored({"host_seconds_per_block_pass": 9.0}, MemoryCorrection(), 37, 0.06,
                        source="a")  # fmt: skip
    assert imported.explain(0.412) == (
        "Step 412 ms predicted, calibrated on 37 runs of cluster a (imported), typical error 6%."
    )
    assert advise(spec(), LOCAL_PROFILE).reason == today.reason.rsplit(" Step", 1)[0]


def test_a_new_calibration_is_planned_anew_and_an_unchanged_one_is_not() -> None:
    first = advise_once(spec(), LOCAL_PROFILE, slower_host(5))

    assert advise_once(spec(), LOCAL_PROFILE, slower_host(5)) is first
    assert advise_once(spec(), LOCAL_PROFILE, slower_host(6)) is not first
    assert advise_once(spec(), LOCAL_PROFILE) is not first


def test_the_cli_says_how_calibrated_a_cluster_is() -> None:
    shown: dict[str, Any] = {
        "cluster": "local", "observations": 5, "typical_error": 0.13, "frozen": True,
        "multipliers": {"mfu_max": 0.157097, "host_seconds_per_block_pass": 3.26828},
        "memory_reason": "CPU ranks: unchanged: 5 exact peaks with room, 10 would lower it",
    }  # fmt: skip

    assert summary(shown) == (
        "cluster local (frozen): calibrated on 5 runs, typical step-time error 13%; "
        "host_seconds_per_block_pass x3.27, mfu_max x0.157; memory: CPU ranks: unchanged: "
        "5 exact peaks with room, 10 would lower it"
    )
    assert summary({**shown, "observations": 0, "frozen": False}) == (
        "cluster local: the advisor's own constants (not calibrated)"
    )
