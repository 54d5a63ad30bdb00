"""The step-time model and the choice against the real H200 runs, as numbers (pure).

- Step-time error alone: predicted / measured - 1 on the runs that had the GPU to themselves
  (``concurrent`` 0). There are two, and they are the ones the host constants were solved on
  (bench/advisor_fit_time.py), so this column checks the fit, not a prediction.
- Step-time error with equal neighbours: within each (model, sequence, micro-batch,
  concurrent) group of two or more runs, the predictions scaled by one factor (the group's
  median measured / predicted, what the neighbours took) against the measurements: the model's
  ratios between plans, which is what a choice reads.
- Choice regret: for each (model, sequence, micro-batch) and budget, among runs of one
  ``concurrent``, the measured tokens/s of the fastest run that really fits (reserved peak plus
  the CUDA context within the budget) over that of the advisor's choice among the same runs.
  A group is compared fairly when its runs had at most one neighbour: with more, two plans that
  do the same work on one GPU (ZeRO-1 and ZeRO-2) differ by up to 15% (``identical_pairs``).
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import BUDGETS_GIB, GIB
from gpu_runs import H200_RUNS, GpuRun, load_gpu_runs

from service.core.advisor.choice import choose
from service.core.advisor.constants import CALIBRATION, Calibration
from service.core.advisor.cost import relative_cost
from service.core.advisor.models import Candidate
from service.core.advisor.workload import usable_device_bytes

FAIR_CONCURRENT = 1  # at most one neighbour: ratios between its runs are a usable guide
REGRET_TARGET = 1.05
ALONE_TARGET = 0.20


@dataclass(frozen=True)
class Regret:
    group: tuple[str, int, int]
    concurrent: int
    budget_gib: float
    chosen: str  # the advisor's choice among the measured runs ("" when none fits)
    best: str  # the fastest run that really fits ("" when none does)
    regret: float  # best / chosen measured tokens/s; 1.0 when both are the same run
    unsafe: bool  # the choice does not really fit

    @property
    def fair(self) -> bool:
        return self.concurrent <= FAIR_CONCURRENT


def alone_errors(runs: list[GpuRun]) -> list[tuple[GpuRun, float]]:
    return [(r, r.predict_time().seconds / r.step_seconds - 1) for r in runs if not r.concurrent]


def neighbour_errors(runs: list[GpuRun]) -> list[tuple[GpuRun, float]]:
    """Relative errors within equal-neighbour groups, one scale per group."""
    groups: dict[tuple[object, ...], list[GpuRun]] = defaultdict(list)
    for run in runs:
        if run.concurrent:
            groups[(*run.group, run.concurrent)].append(run)
    errors = []
    for members in groups.values():
        if len(members) < 2:
            continue
        scale = statistics.median(r.step_seconds / r.predict_time().seconds for r in members)
        errors += [(r, scale * r.predict_time().seconds / r.step_seconds - 1) for r in members]
    return errors


def candidate_of(run: GpuRun, budget: int, calibration: Calibration = CALIBRATION) -> Candidate:
    """The advisor's Candidate for a measured run (what ``choose`` reads)."""
    memory, step = run.predict(calibration), run.predict_time(calibration)
    lay = run.layout
    return Candidate.model_construct(
        zero_stage=lay.stage,
        offload_optimizer="cpu" if lay.offload_optimizer else "none",
        offload_param="cpu" if lay.offload_param else "none",
        activation_checkpointing=lay.checkpointing,
        micro_batch_size=lay.micro_batch,
        gradient_accumulation_steps=lay.accumulation,
        per_gpu_bytes=memory.per_gpu,
        cpu_bytes_per_node=memory.cpu_bytes_per_node,
        fits=memory.per_gpu.total <= budget,
        relative_cost=relative_cost(run.work, lay, calibration, step),
        ds_config={},
        peak_phase=memory.phase,
        step_seconds=step.seconds,
        tokens_per_second=step.tokens_per_second,
    )


def really_fits(run: GpuRun, budget_gib: float) -> bool:
    return run.reserved + CALIBRATION.overhead.gpu_context_bytes <= budget_gib * GIB


def regrets(runs: list[GpuRun]) -> list[Regret]:
    groups: dict[tuple[tuple[str, int, int], int], list[GpuRun]] = defaultdict(list)
    for run in runs:
        groups[(run.group, run.concurrent)].append(run)
    rows = []
    for (group, concurrent), members in sorted(groups.items()):
        if len(members) < 2:
            continue
        rows += [regret_at(group, concurrent, members, budget) for budget in BUDGETS_GIB]
    return rows


def regret_at(
    group: tuple[str, int, int],
    concurrent: int,
    members: list[GpuRun],
    budget_gib: float,
    calibration: Calibration = CALIBRATION,
) -> Regret:
    capacity = int(budget_gib * GIB)
    usable = [usable_device_bytes(capacity, offload=r.layout.offload_optimizer) for r in members]
    by_candidate = [
        (candidate_of(r, u, calibration), r) for r, u in zip(members, usable, strict=True)
    ]
    fitting = [c for c, _ in by_candidate if c.fits]
    real = [r for r in members if really_fits(r, budget_gib)]
    best = max(real, key=lambda r: r.tokens_per_second) if real else None
    if not fitting:
        return Regret(group, concurrent, budget_gib, "", best.label if best else "", 1.0, False)
    chosen_candidate = choose(fitting, "throughput")
    chosen = next(r for c, r in by_candidate if c is chosen_candidate)
    ratio = best.tokens_per_second / chosen.tokens_per_second if best else 1.0
    unsafe = not really_fits(chosen, budget_gib)
    return Regret(
        group, concurrent, budget_gib, chosen.label, best.label if best else "", ratio, unsafe
    )


def identical_pairs(runs: list[GpuRun]) -> list[tuple[str, int, float]]:
    """ZeRO-1 against ZeRO-2 of the same job and neighbours: the same work on one GPU, so their
    measured ratio is the noise the neighbours add."""
    pairs = []
    for one in runs:
        if one.layout.stage != 1:
            continue
        for two in runs:
            same = (two.group, two.concurrent, two.layout.checkpointing) == (
                one.group, one.concurrent, one.layout.checkpointing,
            )  # fmt: skip
            if two.layout.stage == 2 and same and not two.layout.offload_optimizer:
                pairs.append((one.label, one.concurrent, one.step_seconds / two.step_seconds))
    return pairs


@dataclass(frozen=True)
class TimeSummary:
    alone_median: float
    alone_worst: float
    neighbour_median: float
    neighbour_worst: float
    neighbour_runs: int
    fair_worst_regret: float
    fair_groups: int
    unsafe: int


def time_summary(path: Path = H200_RUNS) -> TimeSummary:
    runs = load_gpu_runs(path)
    alone = [e for _, e in alone_errors(runs)]
    near = [e for _, e in neighbour_errors(runs)]
    rows = regrets(runs)
    fair = [r for r in rows if r.fair]
    return TimeSummary(
        alone_median=statistics.median(abs(e) for e in alone) if alone else 0.0,
        alone_worst=max(alone, key=abs) if alone else 0.0,
        neighbour_median=statistics.median(abs(e) for e in near) if near else 0.0,
        neighbour_worst=max(near, key=abs) if near else 0.0,
        neighbour_runs=len(near),
        fair_worst_regret=max((r.regret for r in fair), default=1.0),
        fair_groups=len({(r.group, r.concurrent) for r in fair}),
        unsafe=sum(r.unsafe for r in rows),
    )


def time_failures(s: TimeSummary) -> list[str]:
    missed = []
    if abs(s.alone_worst) > ALONE_TARGET:
        missed.append(f"step time alone: worst {s.alone_worst:+.1%} (target ±{ALONE_TARGET:.0%})")
    if s.fair_worst_regret > REGRET_TARGET:
        missed.append(
            f"choice regret: worst {s.fair_worst_regret:.3f} in a fair group "
            f"(target <= {REGRET_TARGET})"
        )
    if s.unsafe:
        missed.append(f"choice: {s.unsafe} choices do not really fit their budget")
    return missed
