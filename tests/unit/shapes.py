"""Reference clusters and models the advisor's tests share."""

from __future__ import annotations

from typing import Any

from service.core.clusters import BackendKind, ClusterProfile

LLAMA_7B: dict[str, Any] = {
    "hidden_size": 4096,
    "num_layers": 32,
    "num_heads": 32,
    "vocab_size": 32000,
    "ffn_size": 11008,
    "tied_embeddings": False,
}


def h100_node(**changes: Any) -> ClusterProfile:
    """A node of 8 x H100-80GB on Slurm; tests change the host memory and node count."""
    fields: dict[str, Any] = {
        "name": "h100",
        "kind": BackendKind.SLURM,
        "accelerator": "nvidia-h100-80gb",
        "gpu_memory_gib": 80,
        "gpus_per_node": 8,
        "cpu_memory_gib": 2048,
        "max_nodes": 4,
        **changes,
    }
    return ClusterProfile.model_validate(fields)


# The H200 runs' models (../shared/data/h200-2026-11-30, bench/data/h200_runs.jsonl) and the
# 6.7B Llama of the issue, as a user writes them: bare shapes with a gated MLP.
LLAMA_1B1: dict[str, Any] = {
    "hidden_size": 2048,
    "num_layers": 16,
    "num_heads": 32,
    "num_kv_heads": 8,
    "ffn_size": 8192,
    "vocab_size": 32000,
    "tied_embeddings": False,
    "mlp": "gated",
}
LLAMA_6B7: dict[str, Any] = {**LLAMA_7B, "mlp": "gated"}


def single_gpu(memory_gib: float) -> ClusterProfile:
    """One GPU of the given usable memory (139.8 GiB: an H200 as torch reports it)."""
    return ClusterProfile.model_validate(
        {
            "name": "gpu",
            "kind": BackendKind.KUBERNETES,
            "accelerator": "nvidia-h200",
            "gpu_memory_gib": memory_gib,
            "gpus_per_node": 1,
            "cpu_memory_gib": 512,
        }
    )
