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

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_runs import H200_RUNS, GpuRun, load_gpu_runs

from service.core.advisor.constants import CALIBRATION
from service.core.advisor.step_time import (
    HOOKED_CONTAINERS,
    OUTER_MODULES,
    predict_step_time,
    zero3_passes,
)


def run(label: str, runs: list[GpuRun]) -> GpuRun:
    """The run of that label, alone on the GPU where there is one (then the most steps)."""
    matching = [r for r in runs if r.label.split() == label.split()]
    return min(matching, key=lambda r: (r.concurrent, -len(r.record.get("step_times_s", []))))


def block_passes(r: GpuRun) -> int:
    return (r.work.shape.layers + 1) * (4 if r.layout.checkpointing else 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=Path, default=H200_RUNS, help="GPU runs, JSON lines")
    runs = load_gpu_runs(parser.parse_args().runs)
    zero0 = run("llama-134m Z0 mb=1 s=1024", runs)
    serial = predict_step_time(zero0.work, zero0.layout).serial_seconds
    per_pass = (zero0.step_seconds - serial) / block_passes(zero0)
    _show("host_seconds_per_block_pass", per_pass)

    zero3 = run("llama-134m Z3 mb=1 s=1024", runs)
    shape = zero3.work.shape
    modules = shape.layers * (len(shape.block_tensors) + HOOKED_CONTAINERS) + OUTER_MODULES
    hooks = modules * zero3_passes(zero3.layout) + zero3.work.parameter_tensors
    serial = predict_step_time(zero3.work, zero3.layout).serial_seconds
    per_hook = (zero3.step_seconds - serial - per_pass * block_passes(zero3)) / hooks
    _show("host_seconds_per_zero3_hook", per_hook, f"over {hooks} hooks")

    offload = run("llama-1.1b Z2+off(opt)+ckpt mb=4 s=2048", runs)
    infinite = replace(CALIBRATION.speeds, host_torch_adam_params_per_s=float("inf"))
    fast = predict_step_time(offload.work, offload.layout, replace(CALIBRATION, speeds=infinite))
    rate = offload.work.shape.parameters / (offload.step_seconds - fast.seconds)
    _show("host_torch_adam_params_per_s", rate)
    device_checks(runs)


def device_checks(runs: list[GpuRun]) -> None:
    """With the 1.1B rows alone on the GPU (bench/gpu_calibrate.py's timing rows): the device's
    efficiency solved from ZeRO-2, the overflow sync from ZeRO-0 - ZeRO-2, checkpointing's
    measured and predicted ratio. The shared runs have none alone, so this prints that."""
    wanted = [r for r in runs if r.group == ("llama-1.1b", 2048, 4) and r.concurrent == 0]
    alone = {r.label.split("mb=")[0].strip(): r for r in wanted}
    zero2, zero0 = alone.get("llama-1.1b Z2"), alone.get("llama-1.1b Z0")
    if zero2 is None:
        print("device efficiency: no llama-1.1b run at 2048 x 4 alone on the GPU here")
        return
    step = predict_step_time(zero2.work, zero2.layout)
    compute = zero2.step_seconds - step.serial_seconds
    mfu = CALIBRATION.speeds.mfu_max * step.device_seconds / compute
    _show("mfu_max", mfu, "(if the device, not the host, set the pace)")
    if zero0 is not None:
        tensors = zero0.work.parameter_tensors
        _show("host_sync_seconds", (zero0.step_seconds - zero2.step_seconds) / tensors)
    ckpt = alone.get("llama-1.1b Z2+ckpt")
    if ckpt is not None:
        predicted = predict_step_time(ckpt.work, ckpt.layout).seconds / step.seconds
        print(
            f"checkpointing ratio: measured {ckpt.step_seconds / zero2.step_seconds:.3f}, "
            f"predicted {predicted:.3f}"
        )


def _show(name: str, solved: float, note: str = "") -> None:
    kept = getattr(CALIBRATION.speeds, name)
    print(f"{name:30} solved {solved:.3e}  constants.py {kept:.3e}  {note}")


if __name__ == "__main__":
    main()
