"""Measure real DeepSpeed memory on this machine's CPU and save it for the advisor's calibration.

For every model size and every ZeRO stage/offload combination in the grid, this renders the
ds_config with the advisor itself, launches a 2-rank DeepSpeed job exactly as zeropilot's local
backend does (``deepspeed --no_ssh --hostfile H --node_rank 0 ...``, CPU, gloo) and lets
``bench/calibrate_worker.py`` measure several micro-batch / sequence / checkpointing points
with that engine. Results go to ``bench/data/cpu_measurements.json``; ``--fit`` then fits the
memory model's constants to them (see ``bench/advisor_fit.py``).

Usage: python bench/advisor_calibrate.py [--quick] [--models tiny,small] [--port-base 29600]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.core.advisor import advise  # noqa: E402
from service.core.clusters import LOCAL_PROFILE  # noqa: E402
from service.core.spec import JobSpec  # noqa: E402

DATA = ROOT / "bench" / "data" / "cpu_measurements.json"
WORKER = ROOT / "bench" / "calibrate_worker.py"
RANKS = 2  # the default; --ranks 4 separates per-rank partitions from whole-model terms

MODELS: dict[str, dict[str, int]] = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "vocab": 128},
    "small": {"hidden": 256, "layers": 4, "heads": 4, "vocab": 2048},
    "medium": {"hidden": 512, "layers": 6, "heads": 8, "vocab": 8192},
}
LAYOUTS = [
    (0, "none"),
    (1, "none"),
    (1, "optimizer"),
    (2, "none"),
    (2, "optimizer"),
    (3, "none"),
    (3, "optimizer"),
    (3, "all"),
]
POINTS = [
    {"micro": 1, "seq": 64, "ckpt": False},
    {"micro": 4, "seq": 64, "ckpt": False},
    {"micro": 4, "seq": 64, "ckpt": True},
    {"micro": 8, "seq": 128, "ckpt": False},
    {"micro": 8, "seq": 128, "ckpt": True},
]
MAX_SEQ = 128


def job_spec(
    model: dict[str, int], stage: int, offload: str, precision: str, ranks: int
) -> JobSpec:
    return JobSpec(
        name="calibrate",
        entrypoint=str(WORKER),
        model={
            "hidden_size": model["hidden"],
            "num_layers": model["layers"],
            "num_heads": model["heads"],
            "vocab_size": model["vocab"],
            "tied_embeddings": False,
        },
        training={"sequence_length": MAX_SEQ, "global_batch_size": ranks, "precision": precision},
        resources={"nodes": 1, "gpus_per_node": ranks},
        zero={"stage": stage, "offload": offload, "activation_checkpointing": False},
    )


def run_one(
    name: str,
    model: dict[str, int],
    stage: int,
    offload: str,
    precision: str,
    ranks: int,
    port: int,
    workdir: Path,
) -> dict[str, Any] | None:
    profile = LOCAL_PROFILE.model_copy(update={"gpus_per_node": ranks})
    spec = job_spec(model, stage, offload, precision, ranks)
    config = advise(spec, profile).plan.ds_config
    config_path = workdir / f"{name}-z{stage}-{offload}-{precision}-r{ranks}.json"
    config_path.write_text(json.dumps(config))
    hostfile = workdir / "hostfile"
    hostfile.write_text(f"localhost slots={ranks}\n")
    out = workdir / config_path.stem
    command = [
        "deepspeed",
        "--no_ssh",
        "--hostfile",
        str(hostfile),
        "--node_rank",
        "0",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
        str(WORKER),
        "--hidden",
        str(model["hidden"]),
        "--layers",
        str(model["layers"]),
        "--heads",
        str(model["heads"]),
        "--vocab",
        str(model["vocab"]),
        "--seq-len",
        str(MAX_SEQ),
        "--points",
        json.dumps(POINTS),
        "--out",
        str(out),
        "--deepspeed_config",
        str(config_path),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    began = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        print(
            f"  FAILED rc={done.returncode} in {seconds:.0f}s\n{done.stdout[-3000:]}"
            f"\n{done.stderr[-3000:]}"
        )
        return None
    records = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(ranks)]
    print(f"  ok in {seconds:.0f}s")
    return {
        "model_name": name,
        "model": model,
        "stage": stage,
        "offload": offload,
        "precision": precision,
        "world_size": ranks,
        "max_seq": MAX_SEQ,
        "ds_config": config,
        "wall_seconds": round(seconds, 1),
        "ranks": records,
    }


def run_key(run: dict[str, Any]) -> tuple[str, int, str, str, int]:
    return (
        run["model_name"],
        run["stage"],
        run["offload"],
        run["precision"],
        run.get("world_size", RANKS),
    )


def has_phases(run: dict[str, Any]) -> bool:
    return "peak_delta_step" in run["ranks"][0]["points"][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="tiny,small,medium")
    parser.add_argument("--layouts", default="all", help="e.g. 2:none,3:all")
    parser.add_argument("--precisions", default="bf16")
    parser.add_argument("--ranks", type=int, default=RANKS)
    parser.add_argument("--port-base", type=int, default=29600)
    parser.add_argument("--out", default=str(DATA))
    args = parser.parse_args()
    layouts = (
        LAYOUTS
        if args.layouts == "all"
        else [(int(s), o) for s, o in (item.split(":") for item in args.layouts.split(","))]
    )
    runs: list[dict[str, Any]] = []
    out = Path(args.out)
    if out.exists():  # resume: keep finished runs measured with the current worker
        runs = [r for r in json.loads(out.read_text())["runs"] if has_phases(r)]
    done = {run_key(r) for r in runs}
    with tempfile.TemporaryDirectory(prefix="zp-calibrate-") as tmp:
        index = 0
        for name in args.models.split(","):
            for precision in args.precisions.split(","):
                for stage, offload in layouts:
                    if (name, stage, offload, precision, args.ranks) in done:
                        continue
                    print(f"{name} ZeRO-{stage} offload={offload} {precision}", flush=True)
                    port = args.port_base + index % 100
                    index += 1
                    result = run_one(
                        name, MODELS[name], stage, offload, precision, args.ranks, port, Path(tmp)
                    )
                    if result:
                        runs.append(result)
                        save(out, runs)


def save(out: Path, runs: list[dict[str, Any]]) -> None:
    import deepspeed
    import torch

    meta = {
        "deepspeed": deepspeed.__version__,
        "torch": torch.__version__,
        "method": "see bench/calibrate_worker.py docstring",
        "points": POINTS,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
