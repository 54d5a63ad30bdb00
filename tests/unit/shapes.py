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
