"""Fit the GPU model's free constants to the H200 runs and print how well each part explains them.

Everything else in the GPU model is read from the DeepSpeed/torch/transformers code (see
service/core/advisor/gpu_memory.py). What the code cannot give is how much the CUDA caching
allocator reserves beyond what is allocated; this fits its two shares by least squares on the
relative error of each run's peak reserved (``train_reserved``):

    reserved = allocated + a * (bytes freed within a step) + b * (optimizer states the first
    step creates)

and prints a and b next to the values in constants.py. Usage: python bench/advisor_fit_gpu.py
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_runs import GpuRun, load_gpu_runs

from service.core.advisor.constants import CALIBRATION
from service.core.advisor.memory import (
    held_bucket_bytes,
    held_gradients,
    lazy_state_bytes,
    optimizer_bytes,
    param_bytes,
)

NO_OVERHEAD = replace(
    CALIBRATION,
    overhead=replace(
        CALIBRATION.overhead,
        gpu_context_bytes=0,
        gpu_reserved_per_transient=0.0,
        gpu_reserved_per_lazy_state=0.0,
    ),
)


def terms(run: GpuRun) -> tuple[float, float, float]:
    """(allocated prediction, freed within a step, lazily created states), bytes."""
    allocated = run.predict(NO_OVERHEAD).per_gpu.total
    work, layout = run.work, run.layout
    held = param_bytes(work, layout) + optimizer_bytes(work, layout)
    held += held_gradients(work, layout) + held_bucket_bytes(work, layout)
    return allocated, allocated - held, lazy_state_bytes(work, layout)


def least_squares(runs: list[GpuRun]) -> tuple[float, float]:
    """Minimise sum(((allocated + a x + b y) - reserved) / reserved)^2 over a, b."""
    sxx = sxy = syy = sxr = syr = 0.0
    for run in runs:
        allocated, freed, lazy = terms(run)
        x, y = freed / run.reserved, lazy / run.reserved
        r = (run.reserved - allocated) / run.reserved
        sxx, sxy, syy = sxx + x * x, sxy + x * y, syy + y * y
        sxr, syr = sxr + x * r, syr + y * r
    det = sxx * syy - sxy * sxy
    return (sxr * syy - syr * sxy) / det, (syr * sxx - sxr * sxy) / det


def main() -> None:
    runs = load_gpu_runs()
    a, b = least_squares(runs)
    overhead = CALIBRATION.overhead
    print(f"runs: {len(runs)}")
    print(
        f"share of bytes freed within a step: fit {a:.3f}, constants.py "
        f"{overhead.gpu_reserved_per_transient}"
    )
    print(
        f"share of lazily created optimizer states: fit {b:.3f}, constants.py "
        f"{overhead.gpu_reserved_per_lazy_state}"
    )
    worst = max(runs, key=lambda r: abs(terms(r)[0] - r.allocated) / r.allocated)
    error = 100 * (terms(worst)[0] - worst.allocated) / worst.allocated
    print(f"allocated peak, worst run: {worst.label} {error:+.1f}%")


if __name__ == "__main__":
    main()
