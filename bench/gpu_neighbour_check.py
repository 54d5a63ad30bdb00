"""How much a neighbour on the GPU slows a device-bound step, measured without DeepSpeed.

Every device-bound H200 run in bench/data/h200_runs.jsonl (llama-1.1b at 2048 x 4 and 4096 x 2
tokens) had one neighbour, so those runs cannot tell a lower device efficiency from the
neighbour's share of the GPU (docs/advisor.md, "Learning from the cluster"). This times the
same model's forward and backward (what the step-time model calls the device part: Hugging Face
LlamaForCausalLM, bf16, SDPA, 4 x 2048 tokens) alone, then as two identical processes started
together behind a barrier, and prints the efficiency the alone time implies and the slowdown.
Needs a CUDA GPU with torch and transformers (no DeepSpeed). Usage:
python bench/gpu_neighbour_check.py [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

LLAMA_1B1 = {"hidden": 2048, "layers": 16, "heads": 32, "kv_heads": 8, "ffn": 8192, "vocab": 32000}
MICRO_BATCH, SEQUENCE = 4, 2048
WARMUP = 5  # allocator growth and kernel selection happen in the first steps


def step_times(steps: int, barrier: Any = None) -> list[float]:
    """Seconds of each forward and backward after the warm-up."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    m = LLAMA_1B1
    config = LlamaConfig(
        hidden_size=m["hidden"], num_hidden_layers=m["layers"], num_attention_heads=m["heads"],
        num_key_value_heads=m["kv_heads"], intermediate_size=m["ffn"], vocab_size=m["vocab"],
        max_position_embeddings=SEQUENCE, tie_word_embeddings=False,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16)
    model.config.use_cache = False
    ids = torch.randint(0, m["vocab"], (MICRO_BATCH, SEQUENCE), device="cuda")
    if barrier is not None:
        barrier.wait()  # both processes start their steps together
    times = []
    for _ in range(WARMUP + steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times[WARMUP:]


def _neighbour(steps: int, barrier: Any, results: Any) -> None:
    results.put(step_times(steps, barrier))


def with_neighbour(steps: int) -> list[list[float]]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_neighbour, args=(steps, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    out = [results.get() for _ in procs]
    for p in procs:
        p.join()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    steps = parser.parse_args().steps
    alone = statistics.median(step_times(steps))
    shared = [statistics.median(t) for t in with_neighbour(steps)]
    tokens = MICRO_BATCH * SEQUENCE
    print(json.dumps({"alone_s": alone, "one_neighbour_s": shared, "tokens": tokens}))
    print(f"forward+backward alone: {alone * 1e3:.1f} ms ({tokens / alone:,.0f} tokens/s)")
    for s in shared:
        print(f"with one identical neighbour: {s * 1e3:.1f} ms, {s / alone:.2f}x alone")


if __name__ == "__main__":
    main()
