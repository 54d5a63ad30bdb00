"""Solve the step-time model's three fitted constants from the H200 runs, and print them.

The model (service/core/advisor/step_time.py) takes its device figures from spec sheets and its
byte counts from the code; three constants describe the host and are solved here, each from one
run in closed form, so that the fit can be read and redone by hand:

- ``host_seconds_per_block_pass``: llama-134m ZeRO-0 mb=1 s=1024, alone on the GPU. Its device
  work is a few milliseconds, so the step is the host's launches plus the serial part.
- ``host_seconds_per_zero3_hook``: llama-134m ZeRO-3 mb=1 s=1024, alone: what its step takes
  beyond the launches, over the number of module and gradient hooks DeepSpeed runs.
- ``host_torch_adam_params_per_s``: llama-1.1b ZeRO-2 + optimizer offload + checkpointing mb=4
  s=2048 (one neighbour, which shares the GPU, not the host's optimizer step): its serial part
  less the PCIe copies, over the parameters stepped.

Usage: python bench/advisor_fit_time.py
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_runs import GpuRun, load_gpu_runs

from service.core.advisor.constants import CALIBRATION
from service.core.advisor.step_time import (
    HOOKED_CONTAINERS,
    OUTER_MODULES,
    parameter_tensors,
    predict_step_time,
    zero3_passes,
)


def run(label: str, runs: list[GpuRun]) -> GpuRun:
    return next(r for r in runs if r.label.split() == label.split())


def block_passes(r: GpuRun) -> int:
    return (r.work.shape.layers + 1) * (4 if r.layout.checkpointing else 3)


def main() -> None:
    runs = load_gpu_runs()
    zero0 = run("llama-134m Z0 mb=1 s=1024", runs)
    serial = predict_step_time(zero0.work, zero0.layout).serial_seconds
    per_pass = (zero0.step_seconds - serial) / block_passes(zero0)
    _show("host_seconds_per_block_pass", per_pass)

    zero3 = run("llama-134m Z3 mb=1 s=1024", runs)
    shape = zero3.work.shape
    modules = shape.layers * (len(shape.block_tensors) + HOOKED_CONTAINERS) + OUTER_MODULES
    hooks = modules * zero3_passes(zero3.layout) + parameter_tensors(shape)
    serial = predict_step_time(zero3.work, zero3.layout).serial_seconds
    per_hook = (zero3.step_seconds - serial - per_pass * block_passes(zero3)) / hooks
    _show("host_seconds_per_zero3_hook", per_hook, f"over {hooks} hooks")

    offload = run("llama-1.1b Z2+off(opt)+ckpt mb=4 s=2048", runs)
    infinite = replace(CALIBRATION.speeds, host_torch_adam_params_per_s=float("inf"))
    fast = predict_step_time(offload.work, offload.layout, replace(CALIBRATION, speeds=infinite))
    rate = offload.work.shape.parameters / (offload.step_seconds - fast.seconds)
    _show("host_torch_adam_params_per_s", rate)


def _show(name: str, solved: float, note: str = "") -> None:
    kept = getattr(CALIBRATION.speeds, name)
    print(f"{name:30} solved {solved:.3e}  constants.py {kept:.3e}  {note}")


if __name__ == "__main__":
    main()
