"""Predicted vs measured per-rank peak memory on the CPU grid, beside other estimators.

Columns, per measured point (rank 0 of a 2-rank run unless N says otherwise):

- measured: the allocator's peak of tensor bytes during one training step (see
  bench/calibrate_worker.py for the method);
- zeropilot: the advisor's predicted total minus its process-overhead constant (tensors only,
  like the measurement), and its error;
- DeepSpeed: ``estimate_zero2_model_states_mem_needs`` (stages 0-2) or
  ``estimate_zero3_model_states_mem_needs`` (stage 3), the numbers DeepSpeed's
  ``estimate_zero{2,3}_model_states_mem_needs_all_live`` print for the same model (built here
  to count its parameters); model states only. Under offload, host and device are the same RAM
  on the CPU, so its per-GPU and per-rank host figures are added;
- accelerate: ``accelerate estimate-memory``'s "Training using Adam" rule (1.15.0's
  ``estimate_training_usage``: the largest of its model/gradient/optimizer sizes, no ZeRO),
  computed here from the parameter count because the command itself needs the Hugging Face Hub.

Writes bench/data/accuracy.md. Usage: python bench/advisor_accuracy.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from advisor_model_vs_runs import ROOT, Point, load_runs, points

from service.core.advisor.advise import DEFAULT_HEADROOM

OUT = ROOT / "bench" / "data" / "accuracy.md"
MIB = 1024**2


def deepspeed_estimate(p: Point) -> float:
    """DeepSpeed's model-states estimate for this rank, in bytes."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    shape, ranks = p.work.shape, p.work.world_size
    offload = p.layout.offload_optimizer
    if p.layout.stage < 3:
        cpu, gpu = estimate_zero2_model_states_mem_needs(
            shape.parameters, num_gpus_per_node=ranks, num_nodes=1, cpu_offload=offload
        )
    else:
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            shape.parameters,
            shape.largest_module_params,
            num_gpus_per_node=ranks,
            num_nodes=1,
            cpu_offload=offload,
            cpu_offload_params=p.layout.offload_param,
            zero_init=False,
        )
    return gpu + (cpu / ranks if offload else 0)


def accelerate_rule(p: Point) -> float:
    """accelerate 1.15.0 estimate_training_usage: max(model, grads, optimizer, step)."""
    fp32_size = 4 * p.work.shape.parameters
    if p.work.precision == "fp32":
        return 4.0 * fp32_size
    return 2.0 * fp32_size


def zeropilot_tensor_bytes(p: Point) -> int:
    per_gpu = p.predict().per_gpu
    return per_gpu.total - per_gpu.overhead


def error(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def table(measured: list[Point]) -> tuple[list[str], list[float], list[float], list[float]]:
    lines = [
        "| point | measured MiB | zeropilot MiB | err | DeepSpeed MiB | err | "
        "accelerate MiB | err |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ours, theirs, acc = [], [], []
    for p in measured:
        peak = p.peak()
        row = [zeropilot_tensor_bytes(p), deepspeed_estimate(p), accelerate_rule(p)]
        errs = [error(value, peak) for value in row]
        ours.append(errs[0])
        theirs.append(errs[1])
        acc.append(errs[2])
        cells = " | ".join(f"{v / MIB:.1f} | {e:+.1f}%" for v, e in zip(row, errs, strict=True))
        lines.append(f"| {p.label} | {peak / MIB:.1f} | {cells} |")
    return lines, ours, theirs, acc


def summary(name: str, errors: list[float]) -> str:
    within = sum(abs(e) <= 10 for e in errors)
    under = [e for e in errors if e < 0]
    worst_under = f"{min(under):+.1f}%" if under else "none"
    return (
        f"| {name} | {statistics.median(abs(e) for e in errors):.1f}% | "
        f"{max(abs(e) for e in errors):.1f}% | {within}/{len(errors)} | {len(under)} | "
        f"{worst_under} |"
    )


def fits_check(measured: list[Point]) -> list[str]:
    """Would the advisor say "fits" where the run needs more? For each point, the smallest
    budget it calls enough (predicted total over 1 - headroom) against what the rank really
    used: its resident-set high-water mark during the step (tensors, process, gloo buffers)."""
    unsafe, margins = [], []
    for p in measured:
        smallest_fitting_budget = p.predict().per_gpu.total / (1.0 - DEFAULT_HEADROOM)
        used = max(int(p.measured["rss_peak"]), int(p.measured["rss_before"]))
        margins.append(100.0 * (smallest_fitting_budget - used) / used)
        if used > smallest_fitting_budget:
            unsafe.append(f"| {p.label} | {used / MIB:.1f} | {smallest_fitting_budget / MIB:.1f} |")
    lines = [
        f"Fits check (headroom {DEFAULT_HEADROOM:.0%}): {len(unsafe)} of {len(measured)} points "
        f"used more resident memory than the smallest budget the advisor calls enough; "
        f"margin of that budget over the resident peak: min {min(margins):+.1f}%, "
        f"median {statistics.median(margins):+.1f}%."
    ]
    if unsafe:
        lines += ["", "| point | resident MiB | smallest fitting budget MiB |", "|---|---:|---:|"]
    return lines + unsafe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.parse_args()
    measured = list(points(load_runs()))
    lines, ours, theirs, acc = table(measured)
    head = [
        "| estimator | median abs err | max abs err | within ±10% | under-predicted | "
        "worst under |",
        "|---|---:|---:|---:|---:|---:|",
        summary("zeropilot", ours),
        summary("DeepSpeed model-states estimators", theirs),
        summary("accelerate rule", acc),
    ]
    text = "\n".join([*head, "", *fits_check(measured), "", *lines]) + "\n"
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
