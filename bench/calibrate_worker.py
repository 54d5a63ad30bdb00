"""One rank of a calibration run: build the tiny GPT, start a DeepSpeed engine, measure memory.

Launched by ``bench/advisor_calibrate.py`` through the ``deepspeed`` launcher (2 ranks, CPU, gloo).
One engine serves several measurement points (micro-batch, sequence length, checkpointing on or
off): those change only activations, and the model, its ZeRO state and the config stay fixed.

For each point, after a warm-up step that creates the optimizer states, this rank records:

- ``held_*``: bytes of every live CPU tensor storage, found by walking the garbage collector's
  objects (each storage counted once), split into parameters, gradients, optimizer states
  (fp32 masters and Adam moments) and the rest. This is what the engine and optimizer hold
  between steps.
- ``peak``: ``held`` before the step plus the highest running sum of allocations minus frees
  that PyTorch's CPU allocator reported to the profiler (``profile_memory=True``) during one
  whole step (forward, backward, optimizer step). This is the allocator's peak of tensor bytes.
- ``rss_*``: the process's resident set size before the step and its high-water mark during
  it (reset through /proc/self/clear_refs), a cross-check that includes what the profiler
  cannot see (gloo/shared-memory buffers, malloc slack).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path
from typing import Any

import deepspeed
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

STEP_MARK = "zeropilot_optimizer_step"  # splits the forward/backward phase from the step

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_tiny import TinyGPT, make_batch  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--seq-len", type=int, required=True, help="longest sequence measured")
    parser.add_argument("--points", required=True, help="JSON list of {micro, seq, ckpt}")
    parser.add_argument("--out", required=True)
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def storage_key(tensor: torch.Tensor) -> tuple[int, int] | None:
    if tensor.device.type != "cpu":
        return None
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        return None
    return (storage.data_ptr(), storage.nbytes())


def add_storages(keys: set[tuple[int, int]], tensors: Any) -> None:
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and (key := storage_key(tensor)) is not None:
            keys.add(key)


def live_storages() -> set[tuple[int, int]]:
    keys: set[tuple[int, int]] = set()
    add_storages(keys, (o for o in gc.get_objects() if isinstance(o, torch.Tensor)))
    return keys


def param_storages(model: nn.Module) -> set[tuple[int, int]]:
    keys: set[tuple[int, int]] = set()
    for param in model.parameters():
        add_storages(keys, [param.data, getattr(param, "ds_tensor", None)])
    return keys


def gradient_storages(model: nn.Module, optimizer: Any) -> set[tuple[int, int]]:
    keys: set[tuple[int, int]] = set()
    add_storages(keys, [p.grad for p in model.parameters()])
    for group in getattr(optimizer, "param_groups", []):
        add_storages(keys, [p.grad for p in group["params"]])
    return keys


def optimizer_storages(optimizer: Any) -> set[tuple[int, int]]:
    """Optimizer states and the tensors it updates (fp32 masters under mixed precision)."""
    keys: set[tuple[int, int]] = set()
    for state in getattr(optimizer, "state", {}).values():
        add_storages(keys, state.values())
    for group in getattr(optimizer, "param_groups", []):
        add_storages(keys, group["params"])
    return keys


def held_breakdown(engine: Any, model: nn.Module) -> dict[str, int]:
    gc.collect()
    live = live_storages()
    params = param_storages(model) & live
    optimizer = getattr(engine, "basic_optimizer", None) or engine.optimizer
    grads = (gradient_storages(model, optimizer) & live) - params
    states = (optimizer_storages(optimizer) & live) - params - grads
    rest = live - params - grads - states

    def total(keys: set[tuple[int, int]]) -> int:
        return sum(size for _, size in keys)

    largest_other = sorted((size for _, size in rest), reverse=True)[:8]
    return {
        "held_total": total(live),
        "held_params": total(params),
        "held_grads": total(grads),
        "held_optimizer": total(states),
        "held_other": total(rest),
        "largest_other": largest_other,
    }


def rss_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def reset_rss_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def train_step(
    engine: Any, args: argparse.Namespace, micro: int, seq: int, generator: torch.Generator
) -> float:
    tokens = make_batch(micro, seq, args.vocab, generator)
    logits = engine(tokens[:, :-1])
    loss = nn.functional.cross_entropy(
        logits.reshape(-1, args.vocab).float(), tokens[:, 1:].reshape(-1)
    )
    engine.backward(loss)
    with record_function(STEP_MARK):
        engine.step()
    return float(loss.item())


def profiled_peak_delta(step: Any) -> dict[str, int]:
    """Highest running sum of CPU allocations minus frees during ``step()``, overall and split
    at the optimizer step: ``peak_delta_fwd_bwd`` before it, ``peak_delta_step`` within/after."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = prof.profiler.kineto_results.events()
    marks = [e.start_ns() for e in events if e.name() == STEP_MARK]
    boundary = min(marks) if marks else None
    memory = [e for e in events if e.name() == "[memory]" and e.device_type().name == "CPU"]
    running, peaks = 0, {"peak_delta": 0, "peak_delta_fwd_bwd": 0, "peak_delta_step": 0}
    for event in sorted(memory, key=lambda e: e.start_ns()):
        running += event.nbytes()
        phase = (
            "peak_delta_step" if boundary and event.start_ns() >= boundary else "peak_delta_fwd_bwd"
        )
        peaks[phase] = max(peaks[phase], running)
        peaks["peak_delta"] = max(peaks["peak_delta"], running)
    return peaks


def measure_point(
    engine: Any,
    model: TinyGPT,
    args: argparse.Namespace,
    point: dict[str, Any],
    generator: torch.Generator,
) -> dict[str, Any]:
    model.checkpoint_activations = bool(point["ckpt"])
    train_step(engine, args, point["micro"], point["seq"], generator)  # settle this point's shapes
    held = held_breakdown(engine, model)
    rss_before = rss_bytes("VmRSS")
    reset_rss_peak()
    deltas = profiled_peak_delta(
        lambda: train_step(engine, args, point["micro"], point["seq"], generator)
    )
    return {
        **point,
        **held,
        **deltas,
        "peak": held["held_total"] + deltas["peak_delta"],
        "rss_before": rss_before,
        "rss_peak": rss_bytes("VmHWM"),
    }


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    rss_start = rss_bytes("VmRSS")
    deepspeed.init_distributed()
    rss_dist = rss_bytes("VmRSS")
    torch.manual_seed(0)
    args.activation_checkpointing = False
    model = TinyGPT(args)
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters()
    )
    rank = torch.distributed.get_rank()
    generator = torch.Generator().manual_seed(1234 + rank)
    points = json.loads(args.points)
    train_step(engine, args, points[0]["micro"], points[0]["seq"], generator)  # creates states
    results = [measure_point(engine, model, args, p, generator) for p in points]
    record = {
        "rank": rank,
        "rss_at_start": rss_start,
        "rss_after_init_distributed": rss_dist,
        "parameters": sum(
            p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters()
        ),
        "points": results,
    }
    with open(f"{args.out}.rank{rank}.json", "w") as handle:
        json.dump(record, handle)


if __name__ == "__main__":
    main()
