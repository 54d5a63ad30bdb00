"""Relative step cost of a layout: its predicted time per sample over the ideal one.

The ideal is the whole per-rank batch in one micro-step at the device's peak efficiency with
nothing else to do, so 1.0 is unreachable and a plan at 1.4 takes 40% longer per sample. It is
the step-time model's prediction (step_time.py) in a unit that does not depend on the hardware,
kept because stored plans and the escalation's reasons carry it.
"""

from __future__ import annotations

from service.core.advisor.constants import CALIBRATION, Calibration
from service.core.advisor.layout import Layout, Workload
from service.core.advisor.step_time import StepTime, predict_step_time


def relative_cost(
    work: Workload,
    layout: Layout,
    calibration: Calibration = CALIBRATION,
    step: StepTime | None = None,
) -> float:
    step = step or predict_step_time(work, layout, calibration)
    ideal = ideal_seconds_per_sample(work, calibration)
    per_sample = step.seconds / work.per_rank_batch
    return round(per_sample / ideal, 3) if ideal > 0 else 1.0


def ideal_seconds_per_sample(work: Workload, calibration: Calibration) -> float:
    whole, _ = work.forward_flops_per_token
    flops = 3.0 * whole * work.sequence_length
    return flops / (work.hardware.peak_flops * calibration.speeds.mfu_max)
