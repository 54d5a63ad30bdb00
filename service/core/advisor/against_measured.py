"""One observed run's predictions beside what it measured: what the plan said when it was made,
and what the cluster's calibrated constants say now (the console's scatter, docs/advisor.md).

The measured memory is what the device had to hold (``needed_bytes``: torch's counters plus
the CUDA context they leave out; a CPU rank's resident peak as it is), the quantity the memory
rule compares with the prediction. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.core.advisor.calibration import ClusterCalibration, Observation
from service.core.advisor.calibration_memory import needed_bytes
from service.core.advisor.memory import predict_memory
from service.core.advisor.step_time import predict_step_time


@dataclass(frozen=True)
class AgainstMeasured:
    measured_step_s: float
    predicted_step_s: float  # with the cluster's calibrated constants
    planned_step_s: float | None  # what the plan said when it was made
    measured_peak_bytes: int | None  # None: the run reported no peak
    predicted_peak_bytes: int
    planned_peak_bytes: int | None

    @property
    def step_error(self) -> float:
        """Predicted over measured, minus one: +0.1 predicts 10% slower than it ran."""
        return self.predicted_step_s / self.measured_step_s - 1

    @property
    def planned_step_error(self) -> float | None:
        planned = self.planned_step_s
        return None if planned is None else planned / self.measured_step_s - 1

    @property
    def peak_error(self) -> float | None:
        """Predicted over measured, minus one: negative under-predicts what the run needed."""
        measured = self.measured_peak_bytes
        return None if not measured else self.predicted_peak_bytes / measured - 1


def against_measured(run: Observation, calibration: ClusterCalibration) -> AgainstMeasured:
    constants = calibration.constants
    step = predict_step_time(run.work, run.layout, constants).seconds
    peak = predict_memory(run.work, run.layout, constants).per_gpu.total
    measured_peak = needed_bytes(run, constants) if run.peak_bytes is not None else None
    return AgainstMeasured(
        measured_step_s=run.step_seconds,
        predicted_step_s=step,
        planned_step_s=run.predicted_step_seconds,
        measured_peak_bytes=measured_peak,
        predicted_peak_bytes=peak,
        planned_peak_bytes=run.predicted_peak_bytes,
    )
