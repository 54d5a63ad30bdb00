"""How long ``advise`` takes to build the whole candidate table for one job (target: < 5 ms median).

Runs each job a number of times after a warm-up and prints the median, 90th percentile and the
number of candidates. The machine is shared, so numbers vary with its load; the minimum is the
least load-sensitive column; run it on a quiet machine for publication.
Usage: python bench/advisor_speed.py [--repeats 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.core.advisor import advise
from service.core.clusters import LOCAL_PROFILE, BackendKind, ClusterProfile
from service.core.spec import JobSpec

H100 = ClusterProfile(
    name="h100",
    kind=BackendKind.SLURM,
    accelerator="nvidia-h100-80gb",
    gpu_memory_gib=80,
    gpus_per_node=8,
    cpu_memory_gib=2048,
    max_nodes=16,
)

JOBS = {
    "tiny example, local CPU 1x2": (
        {
            "hidden_size": 64,
            "num_layers": 2,
            "num_heads": 4,
            "vocab_size": 128,
            "tied_embeddings": False,
        },
        {"sequence_length": 32, "global_batch_size": 8},
        (1, 2),
        LOCAL_PROFILE,
    ),
    "7B, 4k seq, H100 1x8": (
        {
            "hidden_size": 4096,
            "num_layers": 32,
            "num_heads": 32,
            "vocab_size": 32000,
            "ffn_size": 11008,
            "tied_embeddings": False,
        },
        {"sequence_length": 4096, "global_batch_size": 256},
        (1, 8),
        H100,
    ),
    "70B GQA, 4k seq, H100 4x8": (
        {
            "hidden_size": 8192,
            "num_layers": 80,
            "num_heads": 64,
            "num_kv_heads": 8,
            "vocab_size": 32000,
            "ffn_size": 28672,
            "tied_embeddings": False,
        },
        {"sequence_length": 4096, "global_batch_size": 1024},
        (4, 8),
        H100,
    ),
}


def time_job(spec: JobSpec, profile: ClusterProfile, repeats: int) -> tuple[list[float], int]:
    candidates = len(advise(spec, profile).candidates)  # warm-up: templates, caches
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        advise(spec, profile)
        seconds.append(time.perf_counter() - began)
    return seconds, candidates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    print(f"{'job':32} {'candidates':>10} {'median ms':>10} {'p90 ms':>8} {'min ms':>7}")
    for name, (model, training, (nodes, gpus), profile) in JOBS.items():
        spec = JobSpec(
            name="speed",
            entrypoint="train.py",
            model=model,
            training=training,
            resources={"cluster": profile.name, "nodes": nodes, "gpus_per_node": gpus},
        )
        seconds, candidates = time_job(spec, profile, args.repeats)
        p90 = statistics.quantiles(seconds, n=10)[-1]
        print(
            f"{name:32} {candidates:>10} {statistics.median(seconds) * 1e3:>10.2f} "
            f"{p90 * 1e3:>8.2f} {min(seconds) * 1e3:>7.2f}"
        )


if __name__ == "__main__":
    main()
