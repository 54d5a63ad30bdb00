"""The step-time side of learning from a cluster: a few speed constants fitted to its steps.

Each fitted constant is today's value (``Speeds``) times ``exp(θ)``. The fit minimises, in log
space, a Huber loss of measured over predicted step time, each observation scaled by its own
spread (alone on the device ``SPREAD_ALONE``; ``k`` neighbours widen it ``1 + k`` times, since
one device-bound neighbour was measured to double a step), plus a Gaussian prior ``θ ~ N(0,
τ²)`` per constant, with ``θ`` kept inside bounds. A constant no observation exercises keeps its
prior value; one odd run is both down-weighted by the Huber loss and stopped at the bound.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from service.core.advisor.constants import Calibration, Speeds
from service.core.advisor.layout import Layout, Workload
from service.core.advisor.linear import solve
from service.core.advisor.step_time import predict_step_time

SPREAD_ALONE = 0.10  # the model's own error on a plan it was not fitted on, log space (~10%)
HUBER = 1.5  # spreads beyond which a residual counts linearly, not squared
STEP = 1e-4  # finite difference in θ for the Jacobian
ITERATIONS = 40


@dataclass(frozen=True)
class Knob:
    """One constant the fit may move: its prior spread (log) and bounds on the multiplier."""

    name: str  # a field of Speeds
    prior_spread: float
    lower: float
    upper: float
    ceiling: float | None = None  # an absolute cap on the value (an efficiency cannot pass 1)


# Why these: they are the terms a cluster changes (device efficiency: clocks, kernels, software;
# host: CPU speed, Python, DeepSpeed's hooks; the host optimizer; the links) and each is exercised
# by some plans alone (device-bound, host-bound, ZeRO-3, offload, N > 1). The byte counts come
# from the code and the hardware table from spec sheets; a profile corrects those directly. The
# bounds are an order of magnitude (what the `cpu` hardware row may be off by).
KNOBS = (
    Knob("mfu_max", 0.3, 0.1, 10.0, ceiling=1.0),  # literature 0.6: tighter prior
    Knob("host_seconds_per_block_pass", 0.5, 0.1, 10.0),  # one H200 run
    Knob("host_seconds_per_zero3_hook", 0.5, 0.1, 10.0),  # one H200 run
    Knob("host_torch_adam_params_per_s", 0.5, 0.1, 10.0),  # one H200 run
    Knob("host_cpu_adam_params_per_s", 0.5, 0.1, 10.0),  # literature
    Knob("link_efficiency", 0.3, 0.1, 10.0, ceiling=1.25),  # the table's 0.8 x 1.25 = the link
)


class TimedRun(Protocol):
    """What the time fit reads of an observation."""

    @property
    def key(self) -> str: ...
    @property
    def work(self) -> Workload: ...
    @property
    def layout(self) -> Layout: ...
    @property
    def step_seconds(self) -> float: ...
    @property
    def neighbours(self) -> int: ...


@dataclass(frozen=True)
class Move:
    """How far one observation pulled one constant: a log multiplier (0.1 is about +10%),
    from the fit linearised at its solution; an observation's moves add up to the shift."""

    observation: str
    constant: str
    log_shift: float


@dataclass(frozen=True)
class SpeedFit:
    speeds: Speeds
    multipliers: dict[str, float]  # each constant over its prior value
    identified: tuple[str, ...]  # constants on which the observations outweigh the prior
    moves: tuple[Move, ...]
    typical_error: float  # median |predicted / measured - 1| with the fitted constants


def spread(run: TimedRun) -> float:
    """Log-space spread of one observation: neighbours take an unknown share of the device."""
    return SPREAD_ALONE * (1 + run.neighbours)


def fitted_speeds(prior: Speeds, theta: Sequence[float]) -> Speeds:
    values = {
        k.name: getattr(prior, k.name) * math.exp(t) for k, t in zip(KNOBS, theta, strict=True)
    }
    return replace(prior, **values)


def log_predicted(run: TimedRun, prior: Calibration, theta: Sequence[float]) -> float:
    constants = replace(prior, speeds=fitted_speeds(prior.speeds, theta))
    return math.log(predict_step_time(run.work, run.layout, constants).seconds)


def bounds(prior: Speeds) -> list[tuple[float, float]]:
    """(lowest, highest) θ of each knob."""
    out = []
    for knob in KNOBS:
        upper = math.log(knob.upper)
        if knob.ceiling is not None:
            upper = min(upper, math.log(knob.ceiling / getattr(prior, knob.name)))
        out.append((math.log(knob.lower), upper))
    return out


@dataclass(frozen=True)
class Linearised:
    residuals: list[float]  # log measured - log predicted
    jacobian: list[list[float]]  # d log predicted / d θ, a row per observation
    weights: list[float]  # Huber weight over the squared spread


def linearise(runs: Sequence[TimedRun], prior: Calibration, theta: list[float]) -> Linearised:
    residuals, jacobian, weights = [], [], []
    for run in runs:
        base = log_predicted(run, prior, theta)
        row = []
        for j in range(len(KNOBS)):
            nudged = [*theta[:j], theta[j] + STEP, *theta[j + 1 :]]
            row.append((log_predicted(run, prior, nudged) - base) / STEP)
        residual = math.log(run.step_seconds) - base
        residuals.append(residual)
        jacobian.append(row)
        weights.append(huber_weight(residual / spread(run)) / spread(run) ** 2)
    return Linearised(residuals, jacobian, weights)


def huber_weight(z: float) -> float:
    return 1.0 if abs(z) <= HUBER else HUBER / abs(z)


def objective(runs: Sequence[TimedRun], prior: Calibration, theta: list[float]) -> float:
    total = sum((t / k.prior_spread) ** 2 for t, k in zip(theta, KNOBS, strict=True))
    for run in runs:
        z = abs(math.log(run.step_seconds) - log_predicted(run, prior, theta)) / spread(run)
        total += z * z if z <= HUBER else 2 * HUBER * z - HUBER * HUBER
    return total


def normal_matrix(lin: Linearised) -> list[list[float]]:
    """JᵀWJ plus the prior's precision."""
    p = len(KNOBS)
    h = [[0.0] * p for _ in range(p)]
    for row, w in zip(lin.jacobian, lin.weights, strict=True):
        for a in range(p):
            for b in range(p):
                h[a][b] += w * row[a] * row[b]
    for a, knob in enumerate(KNOBS):
        h[a][a] += 1.0 / knob.prior_spread**2
    return h


def gauss_newton_step(lin: Linearised, theta: list[float]) -> list[float]:
    p = len(KNOBS)
    gradient = [-theta[a] / KNOBS[a].prior_spread ** 2 for a in range(p)]
    for row, w, r in zip(lin.jacobian, lin.weights, lin.residuals, strict=True):
        for a in range(p):
            gradient[a] += w * row[a] * r
    return solve(normal_matrix(lin), gradient)


def clipped(theta: list[float], limits: list[tuple[float, float]]) -> list[float]:
    return [min(hi, max(lo, t)) for t, (lo, hi) in zip(theta, limits, strict=True)]


def solve_theta(runs: Sequence[TimedRun], prior: Calibration) -> list[float]:
    """Projected Gauss-Newton on the Huber objective, halving a step that does not help."""
    theta, limits = [0.0] * len(KNOBS), bounds(prior.speeds)
    current = objective(runs, prior, theta)
    for _ in range(ITERATIONS):
        step = gauss_newton_step(linearise(runs, prior, theta), theta)
        for _ in range(12):
            trial = clipped([t + s for t, s in zip(theta, step, strict=True)], limits)
            value = objective(runs, prior, trial)
            if value <= current:
                break
            step = [s / 2 for s in step]
        else:
            return theta
        moved = max(abs(a - b) for a, b in zip(trial, theta, strict=True))
        theta, current = trial, value
        if moved < 1e-6:
            break
    return theta


def moves(runs: Sequence[TimedRun], lin: Linearised, theta: list[float]) -> tuple[Move, ...]:
    """Each observation's share of the shift: H⁻¹ Jᵢᵀ wᵢ (rᵢ + Jᵢ θ). At the solution
    (no bound reached) the shares add up to θ, the prior contributing nothing (its mean is 0)."""
    h, out = normal_matrix(lin), []
    for run, row, w, r in zip(runs, lin.jacobian, lin.weights, lin.residuals, strict=True):
        working = r + sum(a * t for a, t in zip(row, theta, strict=True))
        shift = solve(h, [w * a * working for a in row])
        out += [
            Move(run.key, k.name, s) for k, s in zip(KNOBS, shift, strict=True) if abs(s) >= 1e-4
        ]
    return tuple(out)


def identified(lin: Linearised) -> tuple[str, ...]:
    """Constants whose information from the observations is at least the prior's."""
    names = []
    for a, knob in enumerate(KNOBS):
        data = sum(w * row[a] ** 2 for row, w in zip(lin.jacobian, lin.weights, strict=True))
        if data >= 1.0 / knob.prior_spread**2:
            names.append(knob.name)
    return tuple(names)


def fit_speeds(runs: Sequence[TimedRun], prior: Calibration) -> SpeedFit:
    theta = solve_theta(runs, prior) if runs else [0.0] * len(KNOBS)
    lin = linearise(runs, prior, theta)
    errors = [abs(math.expm1(-r)) for r in lin.residuals]  # predicted / measured - 1
    return SpeedFit(
        speeds=fitted_speeds(prior.speeds, theta),
        multipliers={k.name: math.exp(t) for k, t in zip(KNOBS, theta, strict=True)},
        identified=identified(lin),
        moves=moves(runs, lin, theta),
        typical_error=statistics.median(errors) if errors else 0.0,
    )
