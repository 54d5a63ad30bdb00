"""The advisor learns from the cluster it runs on: observations in, calibrated constants out.

An ``Observation`` is one attempt that ran long enough to be steady: the plan as the advisor
modelled it (``Workload`` and ``Layout``, enough to run the step-time and memory models again),
the median of its steady step times, its peak memory per rank where known, and how many other
attempts shared its device. ``fit`` turns one cluster's observations into a
``ClusterCalibration``: its ``constants`` are the advisor's own ``Calibration`` type, so every
code path that takes constants (``predict_step_time``, ``predict_memory``, ``evaluate_layout``)
takes a cluster's as they are. With no observations they are the prior, unchanged. Pure: the
service stores observations and decides when to refit (never inside a request).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from service.core.advisor.calibration_memory import (
    MemoryCorrection,
    PeakKind,
    correct_memory,
    with_share,
)
from service.core.advisor.calibration_time import KNOBS, Move, fit_speeds, fitted_speeds
from service.core.advisor.constants import CALIBRATION, Calibration
from service.core.advisor.layout import Layout, Workload

WARMUP_STEPS = 3  # the first steps build optimizer states, pick kernels and grow the allocator
STEADY_STEPS = 5  # fewer steady steps than this say too little to learn from


@dataclass(frozen=True)
class Observation:
    """What was predicted and measured for one steady attempt."""

    key: str  # names the attempt in the calibration's record (e.g. its id)
    work: Workload
    layout: Layout
    step_seconds: float  # median of the steady steps (``steady_step_seconds``)
    neighbours: int = 0  # other attempts on the same device while it ran (0: alone)
    peak_bytes: int | None = None  # the highest rank's peak, when the runtime reported one
    peak_kind: PeakKind = "allocated"  # torch's max_memory_allocated, what the runtime sends
    predicted_step_seconds: float | None = None  # what the advisor said then, for display
    predicted_peak_bytes: int | None = None

    def __post_init__(self) -> None:
        if not self.step_seconds > 0:  # the fit works in log space
            raise ValueError(f"{self.key}: step_seconds must be positive, not {self.step_seconds}")
        if self.neighbours < 0:
            raise ValueError(f"{self.key}: neighbours must be 0 or more, not {self.neighbours}")

    @property
    def accelerator(self) -> str:
        return "cpu" if self.work.on_cpu else self.work.hardware.name


@dataclass(frozen=True)
class ClusterCalibration:
    """One cluster's constants and the record of how its observations produced them."""

    constants: Calibration  # hand these to the advisor's models
    multipliers: Mapping[str, float] = field(default_factory=dict)  # fitted over prior value
    identified: tuple[str, ...] = ()  # speed constants the observations outweigh the prior on
    moves: tuple[Move, ...] = ()  # which observation pulled which speed constant, how far
    memory: MemoryCorrection = field(default_factory=MemoryCorrection)
    observations: int = 0
    typical_error: float = 0.0  # median |predicted / measured - 1| of step time after the fit
    source: str = ""  # the cluster whose runs these are, when imported ("": this one's)

    def moves_of(self, constant: str) -> list[Move]:
        """The observations that moved one constant, the strongest pull first."""
        found = [m for m in self.moves if m.constant == constant]
        return sorted(found, key=lambda m: -abs(m.log_shift))

    @property
    def signature(self) -> tuple[object, ...]:
        """What predictions depend on: equal signatures plan alike (the advice memo's key)."""
        return (
            tuple(sorted(self.multipliers.items())),
            self.memory.gpu_share,
            self.memory.cpu_share,
            self.observations,
            self.typical_error,
            self.source,
        )

    def explain(self, step_seconds: float | None) -> str:
        """The reason's sentence on where the plan's step time comes from."""
        step = f"step {step_seconds * 1000:.0f} ms predicted" if step_seconds else "step time"
        if not self.observations:
            return f"{step.capitalize()} from the advisor's constants (not calibrated here yet)."
        runs = "run" if self.observations == 1 else "runs"
        where = f"cluster {self.source} (imported)" if self.source else "this cluster"
        return (
            f"{step.capitalize()}, calibrated on {self.observations} {runs} of {where}, "
            f"typical error {self.typical_error:.0%}."
        )


def steady_step_seconds(step_seconds: Sequence[float]) -> float | None:
    """The median step after the warm-up, or None when too few steps were steady."""
    steady = list(step_seconds)[WARMUP_STEPS:]
    return statistics.median(steady) if len(steady) >= STEADY_STEPS else None


def fit(
    observations: Sequence[Observation], prior: Calibration = CALIBRATION
) -> ClusterCalibration:
    """Calibrate the step-time constants and the memory share on one cluster's observations."""
    if not observations:
        return ClusterCalibration(constants=prior)
    speeds = fit_speeds(observations, prior)
    memory = correct_memory(observations, prior)
    constants = replace(prior, speeds=speeds.speeds)
    constants = with_share(with_share(constants, False, memory.gpu_share), True, memory.cpu_share)
    return ClusterCalibration(
        constants=constants,
        multipliers=speeds.multipliers,
        identified=speeds.identified,
        moves=speeds.moves,
        memory=memory,
        observations=len(observations),
        typical_error=speeds.typical_error,
    )


def restored(
    multipliers: Mapping[str, float],
    memory: MemoryCorrection,
    observations: int,
    typical_error: float,
    prior: Calibration = CALIBRATION,
    source: str = "",
) -> ClusterCalibration:
    """A stored calibration made whole again: the multipliers over ``prior`` and the shares."""
    theta = [math.log(multipliers.get(k.name, 1.0)) for k in KNOBS]
    constants = replace(prior, speeds=fitted_speeds(prior.speeds, theta))
    constants = with_share(with_share(constants, False, memory.gpu_share), True, memory.cpu_share)
    return ClusterCalibration(
        constants=constants,
        multipliers=dict(multipliers),
        memory=memory,
        observations=observations,
        typical_error=typical_error,
        source=source,
    )
