"""The advisor's accuracy on real runs, as numbers a test and a bench command share (pure).

Two grids:

- H200: 44 real DeepSpeed runs on one GPU (bench/data/h200_runs.jsonl). The advisor predicts
  what the caching allocator reserves (its ``total`` less the CUDA context). A prediction is
  right when it lies in the band from the run's peak allocated to its peak reserved; its error
  is the distance to the nearer edge of that band, relative to the edge. A verdict is unsafe
  when the advisor says ``fits`` at a budget (16 ... 139.8 GiB, less the measured headroom)
  that the run's real reserved peak plus the CUDA context exceeds.
- CPU: 155 measured points of 2- and 4-rank runs (bench/data/cpu_measurements.json); error of
  the predicted tensor bytes against the measured tensor peak; unsafe when the smallest budget
  the advisor calls enough is below the rank's resident high-water mark.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from advisor_model_vs_runs import load_runs, points
from gpu_runs import H200_RUNS, GpuRun, load_gpu_runs

from service.core.advisor.constants import CALIBRATION, FIXED_HEADROOM
from service.core.advisor.workload import usable_device_bytes

GIB = 1024**3
BUDGETS_GIB = (16, 24, 40, 48, 80, 94, 139.8)
TARGETS = {"h200": (0.95, 0), "cpu": (152 / 155, 0)}  # (share within ±10%, unsafe verdicts)


@dataclass(frozen=True)
class Summary:
    name: str
    runs: int
    within: int  # |error| <= 10%
    median_error: float  # percent, absolute
    worst_error: float  # percent, signed
    unsafe: int

    def meets(self, share: float, unsafe: int) -> bool:
        return self.within >= share * self.runs - 1e-9 and self.unsafe <= unsafe


def band_error(predicted: int, allocated: int, reserved: int) -> float:
    """Percent from the band [allocated, reserved]; 0 inside it."""
    if predicted < allocated:
        return 100.0 * (predicted - allocated) / allocated
    if predicted > reserved:
        return 100.0 * (predicted - reserved) / reserved
    return 0.0


def predicted_reserved(run: GpuRun) -> int:
    return run.predict().per_gpu.total - CALIBRATION.overhead.gpu_context_bytes


def unsafe_budgets(run: GpuRun) -> list[float]:
    """Budgets where the advisor says fits but the real run needs more."""
    total = run.predict().per_gpu.total
    needs = run.reserved + CALIBRATION.overhead.gpu_context_bytes
    offload = run.layout.offload_optimizer
    return [
        b
        for b in BUDGETS_GIB
        if total <= usable_device_bytes(int(b * GIB), offload=offload) and needs > b * GIB
    ]


def h200_rows(path: Path = H200_RUNS) -> list[tuple[GpuRun, int, float]]:
    rows = []
    for run in load_gpu_runs(path):
        predicted = predicted_reserved(run)
        rows.append((run, predicted, band_error(predicted, run.allocated, run.reserved)))
    return rows


def h200_summary(path: Path = H200_RUNS) -> Summary:
    rows = h200_rows(path)
    errors = [e for _, _, e in rows]
    unsafe = sum(len(unsafe_budgets(run)) for run, _, _ in rows)
    grid = "H200" if path == H200_RUNS else "GPU"
    return _summary(f"{grid} ({len(rows)} runs)", errors, unsafe)


def cpu_summary() -> Summary:
    errors, unsafe = [], 0
    for p in points(load_runs()):
        per_gpu = p.predict().per_gpu
        tensors = per_gpu.total - per_gpu.overhead
        errors.append(100.0 * (tensors - p.peak()) / p.peak())
        smallest_fitting = per_gpu.total / (1.0 - FIXED_HEADROOM)
        unsafe += max(int(p.measured["rss_peak"]), int(p.measured["rss_before"])) > smallest_fitting
    return _summary(f"CPU grid ({len(errors)} points)", errors, unsafe)


def _summary(name: str, errors: list[float], unsafe: int) -> Summary:
    return Summary(
        name=name,
        runs=len(errors),
        within=sum(abs(e) <= 10.0 for e in errors),
        median_error=statistics.median(abs(e) for e in errors),
        worst_error=max(errors, key=abs),
        unsafe=unsafe,
    )


def summaries(gpu_runs: Path = H200_RUNS) -> dict[str, Summary]:
    return {"h200": h200_summary(gpu_runs), "cpu": cpu_summary()}


def failures(results: dict[str, Summary]) -> list[str]:
    """Which grid misses its target, in words; empty when all meet them."""
    missed = []
    for key, (share, unsafe) in TARGETS.items():
        s = results[key]
        if not s.meets(share, unsafe):
            missed.append(
                f"{s.name}: {s.within}/{s.runs} within ±10% (target {share:.0%}), "
                f"{s.unsafe} unsafe (target {unsafe})"
            )
    return missed


def initialize_errors(path: Path = H200_RUNS) -> list[tuple[GpuRun, float]]:
    """Predicted tensor bytes at the peak of deepspeed.initialize against the run's
    ``init_peak`` (allocated; the prediction less the CUDA context), percent."""
    rows = []
    for run in load_gpu_runs(path):
        if "init_peak" not in run.record:
            continue
        predicted = run.predict().initialize_bytes - CALIBRATION.overhead.gpu_context_bytes
        measured = int(run.record["init_peak"])
        rows.append((run, 100.0 * (predicted - measured) / measured))
    return rows
