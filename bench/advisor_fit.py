"""Fit the memory model's free constants to the CPU measurements in bench/data/.

What DeepSpeed allocates per ZeRO stage (which tensors, whole or partitioned) is fixed in
``service/core/advisor/memory.py``; what is fitted here are the few scalars the structure leaves
open, each from the phase of the step that shows it:

- the optimizer step: torch AdamW's scratch in fp32 partitions, and the 16-bit logits the loop
  still holds (also alive at the end of backward);
- activations (end of forward), on the points whose forward/backward peak is above what the
  end of backward explains: bytes per token for a transformer block (a scale on the
  Korthikanti 8h + 2f split), for the logits, for embeddings, and for checkpointed inputs;
- the process's non-tensor resident memory (RSS before a step minus live tensor bytes).

Least squares on errors relative to each point's measured peak, coefficients kept >= 0.
Writes bench/data/cpu_fit.json and prints the values to put in constants.py.
Usage: python bench/advisor_fit.py
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from advisor_model_vs_runs import ROOT, Point, load_runs, points

from service.core.advisor.constants import (
    CALIBRATION,
    DEFAULT_HEADROOM,
    Activations,
    Calibration,
)
from service.core.advisor.memory import (
    backward_phase,
    forward_phase,
    offloaded_bytes_per_rank,
    optimizer_bytes,
    param_bytes,
    partition,
    step_phase,
)

OUT = ROOT / "bench" / "data" / "cpu_fit.json"
NO_ACTIVATIONS = Activations(0, 0, 0, 0, 0, 0, 0)
ACTIVATION_TERMS = [
    "block_scale",
    "logits_bytes_per_vocab",
    "embedding_per_hidden",
    "checkpointed_per_hidden",
]


def state_bytes(p: Point) -> int:
    return (
        param_bytes(p.work, p.layout)
        + optimizer_bytes(p.work, p.layout)
        + offloaded_bytes_per_rank(p.work, p.layout)
    )


def activation_row(p: Point) -> list[float]:
    shape, w = p.work.shape, p.work.weight_bytes
    tokens = p.layout.micro_batch * p.work.sequence_length
    block = tokens * (8 * shape.hidden + 2 * shape.ffn) * w / 8  # scale 8 = Korthikanti
    if p.layout.checkpointing:
        return [
            block,
            tokens * shape.vocab,
            tokens * shape.hidden * w,
            shape.layers * tokens * shape.hidden * w,
        ]
    return [shape.layers * block, tokens * shape.vocab, tokens * shape.hidden * w, 0.0]


def forward_target(p: Point, calibration: Calibration) -> float:
    phase = forward_phase(p.work, p.layout, calibration)
    return p.phase_peak("backward") - state_bytes(p) - phase.gradients - phase.buffers


def forward_dominated(p: Point, calibration: Calibration) -> bool:
    """The measured forward/backward peak is clearly above the predicted end of backward."""
    end_of_backward = state_bytes(p) + backward_phase(p.work, p.layout, calibration).transient()
    return p.phase_peak("backward") > 1.02 * end_of_backward


def step_row(p: Point) -> list[float]:
    shape = p.work.shape
    numel = shape.largest_tensor if p.layout.stage == 0 else partition(shape.parameters, p.work)
    tokens = p.layout.micro_batch * p.work.sequence_length
    return [4.0 * numel, tokens * shape.vocab]


def step_target(p: Point, calibration: Calibration) -> float:
    phase = step_phase(p.work, p.layout, calibration)
    return p.phase_peak("step") - state_bytes(p) - phase.gradients - phase.buffers


def nonnegative_lstsq(
    rows: list[list[float]], targets: list[float], weights: list[float]
) -> list[float]:
    """Least squares; a coefficient that comes out negative is fixed at 0 and the rest refitted."""
    a = np.array(rows) * np.array(weights)[:, None]
    b = np.array(targets) * np.array(weights)
    free = list(range(a.shape[1]))
    while True:
        solution = np.zeros(a.shape[1])
        solution[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
        negative = [i for i in free if solution[i] < 0]
        if not negative:
            return [float(x) for x in solution]
        free.remove(negative[0])


def resident_peak(p: Point) -> int:
    return max(int(p.measured["rss_peak"]), int(p.measured["rss_before"]))


def process_fit(measured: list[Point], calibration: Calibration) -> tuple[float, float]:
    """A rank's resident memory beyond its predicted tensors: a fixed part (interpreter, torch,
    gloo, DeepSpeed's shared-memory buffers) plus a share of the tensors that glibc keeps after
    they are freed. The share is fitted against each point's resident high-water mark; the fixed
    part is then raised until no point's resident peak exceeds the smallest budget the advisor
    would call enough (predicted total over 1 - headroom): "fits" must never be optimistic."""
    predicted = [tensor_bytes(p, calibration) for p in measured]
    base, share = nonnegative_lstsq(
        [[1.0, float(t)] for t in predicted],
        [resident_peak(p) - t for p, t in zip(measured, predicted, strict=True)],
        [1.0 / resident_peak(p) for p in measured],
    )
    usable = 1.0 - DEFAULT_HEADROOM
    needed = max(
        usable * resident_peak(p) - (1.0 + share) * t
        for p, t in zip(measured, predicted, strict=True)
    )
    mib = 1024**2
    return max(base, -(-needed // mib) * mib), share  # whole MiB, rounded up


def tensor_bytes(p: Point, calibration: Calibration) -> int:
    per_gpu = p.predict(calibration).per_gpu
    return per_gpu.total - per_gpu.overhead


def main() -> None:
    measured = list(points(load_runs()))
    calibration = dataclasses.replace(CALIBRATION, activations=NO_ACTIVATIONS)
    weights = [1.0 / p.peak() for p in measured]
    step = nonnegative_lstsq(
        [step_row(p) for p in measured], [step_target(p, calibration) for p in measured], weights
    )
    logits_only = dataclasses.replace(NO_ACTIVATIONS, kept_logits_bytes_per_vocab=step[1])
    with_logits = dataclasses.replace(calibration, activations=logits_only)
    forward = [p for p in measured if forward_dominated(p, with_logits)]
    act = nonnegative_lstsq(
        [activation_row(p) for p in forward],
        [forward_target(p, calibration) for p in forward],
        [1.0 / p.peak() for p in forward],
    )
    process, slack = process_fit(measured, CALIBRATION)  # the constants now in constants.py
    fitted = {
        "points": len(measured),
        "forward_dominated_points": len(forward),
        "activations": dict(zip(ACTIVATION_TERMS, act, strict=True)),
        "per_hidden": 8 * act[0] / 8,
        "per_ffn": 2 * act[0] / 8,
        "torch_adam_partitions": step[0],
        "kept_logits_bytes_per_vocab": step[1],
        "cpu_process_bytes": int(process),
        "cpu_fragmentation": slack,
    }
    OUT.write_text(json.dumps(fitted, indent=1))
    print(json.dumps(fitted, indent=1))


if __name__ == "__main__":
    main()
