"""One configuration under evaluation, and the job facts every evaluation shares.

``Layout`` is what varies between candidates (stage, offload, checkpointing, micro-batch, the
DeepSpeed knobs that cost memory); ``Workload`` is what does not (model, batch, precision,
hardware). Both are plain frozen dataclasses so that evaluating hundreds of them stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from service.core.advisor.hardware import DEFAULT_HARDWARE, Hardware
from service.core.advisor.shape import ModelShape

ARTICLE_BUCKET = 500_000_000  # the ZeRO article's starting point, also DeepSpeed's default
DEFAULT_PREFETCH = 50_000_000  # DeepSpeed's stage-3 default
DEFAULT_PERSISTENCE = 100_000
DEFAULT_MAX_LIVE = 1_000_000_000
BUCKET_QUANTUM = 1_000_000  # round model-sized buckets up to a million elements


@dataclass(frozen=True)
class Knobs:
    """DeepSpeed settings whose values change memory, in elements like the ds_config."""

    reduce_bucket_size: int
    allgather_bucket_size: int
    prefetch_bucket_size: int
    param_persistence_threshold: int
    max_live_parameters: int
    overlap_comm: bool
    pin_memory: bool
    sub_group_size: int = (
        1_000_000_000  # DeepSpeed's ZeRO-3 default: the optimizer steps this much at once
    )


@dataclass(frozen=True)
class Layout:
    stage: int
    offload_optimizer: bool
    offload_param: bool
    checkpointing: bool
    micro_batch: int
    accumulation: int
    knobs: Knobs

    @property
    def offload_level(self) -> int:
        """0 none, 1 optimizer, 2 optimizer and parameters: the order of preference."""
        return 2 if self.offload_param else int(self.offload_optimizer)


@dataclass(frozen=True)
class Workload:
    shape: ModelShape
    sequence_length: int
    global_batch: int
    precision: str  # "bf16" | "fp16" | "fp32"
    optimizer: str  # "adamw" | "adam" | "sgd"
    optimizer_impl: str  # "fused" | "torch", already resolved for the accelerator
    nodes: int
    gpus_per_node: int
    on_cpu: bool  # ranks are CPU processes: "device" and host memory are the same RAM
    hardware: Hardware = DEFAULT_HARDWARE  # the step-time model's device and links

    @cached_property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @cached_property
    def per_rank_batch(self) -> int:
        return self.global_batch // self.world_size

    @cached_property
    def weight_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @cached_property
    def forward_flops_per_token(self) -> tuple[float, float]:
        """(whole model, blocks only) forward FLOPs per token: two per weight of every matmul,
        the head's included, and the attention scores and mix (half under a causal kernel)."""
        shape = self.shape
        causal = 1.0 if shape.flash_attention else 2.0  # eager attention computes the masked half
        attention = 2.0 * shape.layers * self.sequence_length * shape.attention_width * causal
        active = shape.experts_per_token / shape.experts
        blocks = 2.0 * shape.layers * shape.layer_params * active + attention
        return blocks + 2.0 * shape.vocab * shape.hidden, blocks

    @cached_property
    def parameter_tensors(self) -> int:
        shape = self.shape
        outer = len(shape.first_tensors) + len(shape.last_tensors)
        return outer + shape.layers * len(shape.block_tensors)


def model_sized_knobs(parameters: int, stage: int) -> Knobs:
    """Bucket sizes no larger than the model: DeepSpeed allocates a bucket whole, used or not."""
    model_sized = -(-parameters // BUCKET_QUANTUM) * BUCKET_QUANTUM
    bucket = min(ARTICLE_BUCKET, model_sized)
    return Knobs(
        reduce_bucket_size=bucket,
        allgather_bucket_size=bucket,
        prefetch_bucket_size=min(DEFAULT_PREFETCH, model_sized),
        param_persistence_threshold=DEFAULT_PERSISTENCE,
        max_live_parameters=DEFAULT_MAX_LIVE,
        overlap_comm=stage > 0,
        pin_memory=True,
    )
