"""A run's predictions beside what it measured: the plan's own, and the calibrated constants'."""

from __future__ import annotations

import pytest

from service.core.advisor import advise
from service.core.advisor.against_measured import against_measured
from service.core.advisor.calibration import ClusterCalibration, restored
from service.core.advisor.calibration_memory import MemoryCorrection
from service.core.advisor.constants import CALIBRATION
from service.core.clusters import LOCAL_PROFILE
from service.core.observing import observation_of
from tests.unit.test_advisor_learning_loop import spec


def test_with_todays_constants_the_prediction_is_the_plans_and_errs_against_the_run() -> None:
    plan = advise(spec(), LOCAL_PROFILE).plan
    assert plan.step_seconds is not None
    run = observation_of("a1", spec(), plan, LOCAL_PROFILE, 2 * plan.step_seconds,
                         peak_bytes=400 * 2**20, kind="resident")  # fmt: skip

    seen = against_measured(run, ClusterCalibration(CALIBRATION))

    assert seen.predicted_step_s == pytest.approx(plan.step_seconds, abs=1e-6)
    assert seen.planned_step_s == plan.step_seconds
    assert seen.step_error == pytest.approx(-0.5, abs=1e-4)  # predicted twice too fast
    assert seen.predicted_peak_bytes == plan.per_gpu_bytes.total
    assert seen.measured_peak_bytes == 400 * 2**20  # a CPU rank's resident peak, as it is
    assert seen.peak_error == pytest.approx(plan.per_gpu_bytes.total / (400 * 2**20) - 1)


def test_calibrated_constants_move_the_prediction_and_a_gpu_peak_counts_the_context() -> None:
    plan = advise(spec(), LOCAL_PROFILE).plan
    assert plan.step_seconds is not None
    run = observation_of("a1", spec(), plan, LOCAL_PROFILE, 0.1, peak_bytes=10**8,
                         kind="allocated")  # fmt: skip
    slower = restored({"host_seconds_per_block_pass": 9.0}, MemoryCorrection(), 5, 0.05)

    seen = against_measured(run, slower)

    assert seen.predicted_step_s > 3 * plan.step_seconds  # host-bound: it follows the host
    assert seen.planned_step_error == pytest.approx(plan.step_seconds / 0.1 - 1)
    # torch's allocated peak leaves out the CUDA context the device also holds
    assert seen.measured_peak_bytes == 10**8 + CALIBRATION.overhead.gpu_context_bytes
    no_peak = observation_of("a2", spec(), plan, LOCAL_PROFILE, 0.1)
    assert against_measured(no_peak, slower).peak_error is None
