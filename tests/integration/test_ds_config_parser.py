"""Every config the advisor can render is accepted by DeepSpeed's own parser, as DeepSpeed reads it.

DeepSpeedConfig takes the data-parallel world size from torch.distributed; the tests stand in a
world of the job's size so the batch identity is checked exactly as in a real launch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from deepspeed.runtime import config as deepspeed_config

from service.core.advisor import advise
from service.core.clusters import LOCAL_PROFILE, BackendKind, ClusterProfile
from service.core.spec import JobSpec

GPU_PROFILE = ClusterProfile(
    name="h100",
    kind=BackendKind.KUBERNETES,
    accelerator="nvidia-h100-80gb",
    gpu_memory_gib=80,
    gpus_per_node=8,
    cpu_memory_gib=2048,
    max_nodes=4,
)
STAGE_OFFLOADS = [
    (0, "none"),
    (1, "none"),
    (1, "optimizer"),
    (2, "none"),
    (2, "optimizer"),
    (3, "none"),
    (3, "optimizer"),
    (3, "all"),
]


@pytest.fixture
def world_of(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Make DeepSpeedConfig see a torch.distributed world of the given size."""

    def set_world(size: int) -> None:
        monkeypatch.setattr(deepspeed_config.dist, "get_rank", lambda *a, **k: 0)
        monkeypatch.setattr(deepspeed_config.dist, "get_world_size", lambda *a, **k: size)

    yield set_world


def spec_for(
    stage: int, offload: str, precision: str, checkpointing: bool, nodes: int, gpus: int
) -> JobSpec:
    return JobSpec(
        name="parse",
        entrypoint="train.py",
        model={"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 128},
        training={
            "sequence_length": 32,
            "global_batch_size": 16 * nodes * gpus,
            "precision": precision,
        },
        resources={"nodes": nodes, "gpus_per_node": gpus},
        zero={"stage": stage, "offload": offload, "activation_checkpointing": checkpointing},
    )


@pytest.mark.parametrize(("stage", "offload"), STAGE_OFFLOADS)
@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize(
    ("profile", "nodes", "gpus"),
    [(LOCAL_PROFILE, 1, 2), (LOCAL_PROFILE, 2, 1), (GPU_PROFILE, 2, 8)],
    ids=["cpu-1x2", "cpu-2x1", "gpu-2x8"],
)
def test_deepspeed_accepts_every_rendered_config(
    world_of: Any,
    stage: int,
    offload: str,
    precision: str,
    checkpointing: bool,
    profile: ClusterProfile,
    nodes: int,
    gpus: int,
) -> None:
    world_of(nodes * gpus)
    advice = advise(spec_for(stage, offload, precision, checkpointing, nodes, gpus), profile)

    for candidate in advice.candidates:
        parsed = deepspeed_config.DeepSpeedConfig(candidate.ds_config)
        assert parsed.zero_optimization_stage == stage
        assert parsed.train_batch_size == 16 * nodes * gpus
        assert parsed.train_micro_batch_size_per_gpu == candidate.micro_batch_size
        assert parsed.gradient_accumulation_steps == candidate.gradient_accumulation_steps
        assert parsed.bfloat16_config.enabled == (precision == "bf16")
        assert parsed.zero_config.offload_optimizer is not None or offload == "none"
        assert (parsed.zero_config.offload_param is not None) == (offload == "all")


def test_deepspeed_rejects_what_the_advisor_would_refuse(world_of: Any) -> None:
    """The batch identity the advisor enforces is DeepSpeed's own rule."""
    world_of(2)
    config = advise(spec_for(1, "none", "bf16", False, 1, 2), LOCAL_PROFILE).plan.ds_config
    config["train_batch_size"] += 2

    with pytest.raises(AssertionError, match="Check batch related parameters"):
        deepspeed_config.DeepSpeedConfig(config)


def test_cpu_offload_configs_keep_torch_adam(world_of: Any) -> None:
    world_of(2)
    config = advise(spec_for(3, "all", "bf16", True, 1, 2), LOCAL_PROFILE).plan.ds_config
    parsed = deepspeed_config.DeepSpeedConfig(config)

    assert parsed.optimizer_params["torch_adam"] is True
    assert parsed.zero_force_ds_cpu_optimizer is False
