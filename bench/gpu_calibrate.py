"""Re-measure the GPU truth on a lent device in one command (under 8 minutes on one H200).

First the step-time rows (``timing_rows``): each alone on the GPU, 10 steps with 3 of warm-up
left out of the median, for the step-time model's constants (bench/advisor_fit_time.py solves
them from the file: host launches and ZeRO-3's hooks from the 134M model, the device's
efficiency and checkpointing's recompute from the 1.1B at 1024 and 8192 tokens, ZeRO-0's
overflow sync from its ZeRO-0/ZeRO-2 pair, the host optimizer from the offload row). Then it
runs bench/gpu_probe.py for the shared grid (the 44 specs of bench/data/h200_runs.jsonl), then
FusedAdam rows (DeepSpeed's default optimizer, which the shared grid lacks), then 2-8 GPU runs
when the machine has several GPUs, then the two held-out cases of the issue (6.7B ZeRO-3 and
ZeRO-0 at 2048 tokens), as long as time is left. Probes run side by side while the advisor's
own predictions of their reserved memory fit the device (peaks are per process, so sharing
the device changes only the throughput columns; ``concurrent`` records it). It writes the same
JSON lines as the shared data and prints the accuracy table for them.

Needs CUDA torch, deepspeed 0.19.8 and transformers on the device machine. Usage:

    python bench/gpu_calibrate.py --out "$OUT/runs.jsonl"          # on the device
    python bench/gpu_calibrate.py --dry-run                         # the schedule, anywhere
    python bench/advisor_check.py --runs runs.jsonl --rows          # the table again, here
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_runs import H200_RUNS, run_of

from service.core.advisor.shape import bare_shape

HERE = Path(__file__).resolve().parent
GIB = 1024**3
LLAMA_1B1 = {"hidden": 2048, "layers": 16, "heads": 32, "kv_heads": 8, "ffn": 8192, "vocab": 32000}
LLAMA_134M = {"hidden": 768, "layers": 12, "heads": 12, "kv_heads": 12, "ffn": 2048, "vocab": 32000}
LLAMA_6B7 = {
    "hidden": 4096,
    "layers": 32,
    "heads": 32,
    "kv_heads": 32,
    "ffn": 11008,
    "vocab": 32000,
}


@dataclass
class Probe:
    spec: dict[str, Any]
    gpus: int = 1
    predicted: int = 0  # bytes the advisor predicts it reserves, CUDA context included
    process: subprocess.Popen[bytes] | None = None
    log: Path = Path(os.devnull)
    concurrent: int = 0
    lines: list[str] = field(default_factory=list)


def shared_grid() -> list[dict[str, Any]]:
    records = [json.loads(line) for line in H200_RUNS.read_text().splitlines() if line]
    return [r["spec"] for r in records]


def timing_rows() -> list[dict[str, Any]]:
    """Runs the step-time model is fitted on, each alone on the GPU (``alone``)."""
    small = {"name": "llama-134m", "model": LLAMA_134M, "seq": 1024, "mb": 1}
    large = {"name": "llama-1.1b", "model": LLAMA_1B1, "seq": 2048, "mb": 4}
    timed = {"steps": 10, "warmup": 3, "alone": True}
    rows = [{**small, **timed, "stage": s, "ckpt": c} for s in (0, 1, 2, 3) for c in (False, True)]
    rows += [{**large, **timed, "stage": s, "ckpt": c} for s in (0, 2, 3) for c in (False, True)]
    rows += [{**large, **timed, "seq": 1024, "mb": 1, "stage": 0, "ckpt": False}]
    offload = {"stage": 2, "ckpt": True, "offload_optimizer": True, "steps": 5, "warmup": 2}
    return [*rows, {**large, **timed, **offload}]


def fused_rows() -> list[dict[str, Any]]:
    base = {"name": "llama-1.1b", "model": LLAMA_1B1, "steps": 4, "optimizer": "fused"}
    rows = [{**base, "seq": 1024, "mb": 1, "stage": s, "ckpt": True} for s in (0, 1, 2, 3)]
    rows += [{**base, "seq": 2048, "mb": 4, "stage": s, "ckpt": False} for s in (2, 3)]
    return rows


def multi_gpu_rows(gpus: int) -> list[dict[str, Any]]:
    if gpus < 2:
        return []
    base = {"name": "llama-1.1b", "model": LLAMA_1B1, "steps": 4, "seq": 1024, "mb": 1}
    return [{**base, "stage": s, "ckpt": True, "gpus": gpus} for s in (1, 2, 3)]


def held_out_rows() -> list[dict[str, Any]]:
    base = {"name": "llama-6.7b", "model": LLAMA_6B7, "steps": 4, "seq": 2048, "mb": 4}
    return [{**base, "stage": 3, "ckpt": True}, {**base, "stage": 0, "ckpt": True}]


def predicted_bytes(spec: dict[str, Any], gpus: int) -> int:
    """The advisor's reserved-plus-context prediction for one probe (for scheduling)."""
    m = spec["model"]
    shape = bare_shape(
        0, m["hidden"], m["layers"], m["heads"], m["kv_heads"], m["ffn"], m["vocab"], False, True
    )
    zero: dict[str, Any] = {"stage": spec["stage"]}
    for key in ("offload_optimizer", "offload_param"):
        if spec.get(key):
            zero[key] = {"device": "cpu", "pin_memory": True}
    params = {"torch_adam": True} if spec.get("optimizer", "torch") == "torch" else {}
    record = {
        "spec": spec,
        "params": shape.counted_parameters,
        "world_size": gpus,
        "ds_config": {"optimizer": {"params": params}, "zero_optimization": zero},
    }
    return run_of(record).predict().per_gpu.total


def command(probe: Probe, port: int) -> list[str]:
    spec = json.dumps({**probe.spec, "port": port})
    script = str(HERE / "gpu_probe.py")
    if probe.gpus == 1:
        return [sys.executable, script, spec]
    launcher = ["deepspeed", "--num_gpus", str(probe.gpus), "--master_port", str(port)]
    return [*launcher, script, spec]


def device() -> tuple[int, int]:
    """(GPUs, bytes per GPU) of this machine."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run this where a GPU is lent (or use --dry-run)")
    return torch.cuda.device_count(), torch.cuda.get_device_properties(0).total_memory


def plan(gpus: int) -> list[Probe]:
    specs = [(s, 1) for s in timing_rows() + shared_grid() + fused_rows()]
    specs += [(s, s.pop("gpus")) for s in multi_gpu_rows(gpus)]
    specs += [(s, 1) for s in held_out_rows()]
    return [Probe(spec, n, predicted_bytes(spec, n)) for spec, n in specs]


def record_of(probe: Probe) -> dict[str, Any] | None:
    """The rank with the highest reserved peak (the budget must hold on every rank)."""
    ranks = [json.loads(line.split("PROBE ", 1)[1]) for line in probe.lines if "PROBE " in line]
    if not ranks:
        return None
    best = max(ranks, key=lambda r: r.get("train_reserved", 0))
    best["concurrent"] = probe.concurrent
    return best


def run_all(probes: list[Probe], capacity: int, jobs: int, deadline: float, out: Path) -> None:
    began, port, running = time.monotonic(), 29600, []
    waiting = list(probes)
    with out.open("w") as sink:
        while waiting or running:
            for probe in [p for p in running if p.process and p.process.poll() is not None]:
                running.remove(probe)
                probe.lines = probe.log.read_text(errors="replace").splitlines()
                record = record_of(probe)
                if record is not None:
                    sink.write(json.dumps(record, sort_keys=True) + "\n")
                    sink.flush()
                outcome = outcome_of(record, probe.lines)
                print(
                    f"{time.monotonic() - began:6.0f}s done  {label(probe)}: {outcome}", flush=True
                )
            late = time.monotonic() - began > deadline
            while waiting and not late and can_start(waiting[0], running, capacity, jobs):
                probe = waiting.pop(0)
                probe.concurrent = len(running)
                env = {**os.environ, "PYTHONUNBUFFERED": "1"}
                probe.log = out.with_name(f"{out.stem}.probe{port}.log")  # no pipe to fill
                with probe.log.open("w") as log:
                    probe.process = subprocess.Popen(
                        command(probe, port), stdout=log, stderr=subprocess.STDOUT, env=env
                    )
                port += 1
                running.append(probe)
                print(f"{time.monotonic() - began:6.0f}s start {label(probe)}", flush=True)
            if late and waiting:
                print(f"deadline: {len(waiting)} probes not started", flush=True)
                waiting.clear()
            time.sleep(1.0)


def outcome_of(record: dict[str, Any] | None, lines: list[str]) -> str:
    if record is None:
        return "no result: " + (lines[-1][:200] if lines else "no output")
    if record.get("ok"):
        return f"reserved {record.get('train_reserved', 0) / GIB:.2f} GiB"
    return f"failed in {record.get('phase')}: {record.get('error', '')[:160]}"


def can_start(probe: Probe, running: list[Probe], capacity: int, jobs: int) -> bool:
    """Side by side while the predictions fit; a several-GPU probe or a big one runs alone."""
    if not running:
        return True
    if probe.spec.get("alone") or any(p.spec.get("alone") for p in running):
        return False  # a timed row has the GPU to itself: its step time is the model's truth
    if probe.gpus > 1 or any(p.gpus > 1 for p in running) or len(running) >= jobs:
        return False
    return sum(p.predicted for p in running) + probe.predicted <= 0.85 * capacity


def label(probe: Probe) -> str:
    s = probe.spec
    offload = "+off(all)" if s.get("offload_param") else ""
    offload = offload or ("+off(opt)" if s.get("offload_optimizer") else "")
    extra = f" {s.get('optimizer', 'torch')}" + (f" N={probe.gpus}" if probe.gpus > 1 else "")
    ckpt = "+ckpt" if s["ckpt"] else ""
    return f"{s['name']} Z{s['stage']}{offload}{ckpt} mb={s['mb']} s={s['seq']}{extra}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("gpu_runs.jsonl"))
    parser.add_argument("--deadline", type=float, default=420.0, help="start nothing after (s)")
    parser.add_argument("--jobs", type=int, default=4, help="probes at once on one GPU")
    parser.add_argument("--dry-run", action="store_true", help="print the schedule only")
    parser.add_argument("--gpus", type=int, default=1, help="with --dry-run: GPUs to plan for")
    args = parser.parse_args()
    if args.dry_run:
        for probe in plan(args.gpus):
            print(f"{probe.predicted / GIB:7.1f} GiB  {label(probe)}")
        return
    gpus, capacity = device()
    run_all(plan(gpus), capacity, args.jobs, args.deadline, args.out)
    subprocess.run(
        [sys.executable, str(HERE / "advisor_check.py"), "--runs", str(args.out), "--rows"],
        check=False,
    )
    subprocess.run(
        [sys.executable, str(HERE / "advisor_fit_time.py"), "--runs", str(args.out)], check=False
    )


if __name__ == "__main__":
    main()
