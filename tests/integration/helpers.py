"""Small builders shared by the integration and end-to-end tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def tiny_spec(name: str = "tiny-gpt", steps: int = 20, **changes: Any) -> dict[str, Any]:
    """The example tiny job as a dict, with working_dir resolved like the CLI does."""
    spec: dict[str, Any] = {
        "name": name,
        "entrypoint": "train_tiny.py",
        "working_dir": str(REPO / "examples"),
        "args": ["--steps", str(steps), "--checkpoint-interval", "10"],
        "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 128},
        "training": {
            "sequence_length": 32,
            "global_batch_size": 8,
            "precision": "fp32",
            "learning_rate": 0.003,
        },
        "resources": {"cluster": "local", "nodes": 1, "gpus_per_node": 2},
    }
    spec.update(changes)
    return spec
