"""The memory model: per-GPU bytes of one layout, by what holds them, and host bytes per node.

Each function below is one line of the breakdown. The peak is the persistent state (parameters,
gradients, optimizer states, communication buffers) plus the larger of the two transient phases:
forward/backward activations or optimizer-step temporaries; the measured runs put the peak in
either, depending on the model and the batch. Allocator slack and runtime context come on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from service.core.advisor.constants import CALIBRATION, Calibration
from service.core.advisor.layout import Layout, Workload
from service.core.advisor.models import PerGpuBytes
from service.core.advisor.shape import ModelShape

FP32 = 4
ADAM_STATES = 8  # exp_avg and exp_avg_sq in fp32
SGD_STATES = 4  # momentum in fp32


@dataclass(frozen=True)
class Prediction:
    per_gpu: PerGpuBytes
    cpu_bytes_per_node: int


def predict_memory(
    work: Workload, layout: Layout, calibration: Calibration = CALIBRATION
) -> Prediction:
    """Predicted peak per GPU and host memory per node for one layout."""
    params = param_bytes(work, layout)
    grads = gradient_bytes(work, layout)
    optimizer = optimizer_bytes(work, layout)
    buffers = buffer_bytes(work, layout)
    activations = activation_bytes(work, layout, calibration)
    temporaries = step_temporary_bytes(work, layout, calibration)
    host = offloaded_bytes_per_rank(work, layout)
    if work.on_cpu:  # "offloading" to the same RAM saves nothing
        optimizer += host
    peak_dynamic = params + grads + optimizer + buffers + max(activations, temporaries)
    overhead = overhead_bytes(work, peak_dynamic, calibration)
    per_gpu = PerGpuBytes.model_construct(
        params=params,
        gradients=grads,
        optimizer=optimizer,
        activations=activations,
        buffers=buffers,
        temporaries=temporaries,
        overhead=overhead,
        total=peak_dynamic + overhead,
    )
    return Prediction(per_gpu, host_bytes_per_node(work, layout, host))


def partition(numel: int, work: Workload) -> int:
    return -(-numel // work.world_size)


def persistent_params(work: Workload, layout: Layout) -> int:
    """ZeRO-3 keeps tensors under the persistence threshold whole on every rank."""
    return _persistent(work.shape, layout.knobs.param_persistence_threshold)


@cache
def _persistent(shape: ModelShape, threshold: int) -> int:
    return sum(n for n in shape.tensor_numels() if n < threshold)


def param_bytes(work: Workload, layout: Layout) -> int:
    total, weight = work.shape.parameters, work.weight_bytes
    if layout.stage < 3:
        return weight * total
    persistent = persistent_params(work, layout)
    sharded = 0 if layout.offload_param else partition(total - persistent, work)
    return weight * (sharded + persistent)


def gradient_bytes(work: Workload, layout: Layout) -> int:
    """Gradients held through backward: whole below ZeRO-2, a partition from ZeRO-2 on."""
    total, weight = work.shape.parameters, work.weight_bytes
    if layout.stage <= 1:
        return weight * total
    if layout.offload_optimizer:  # reduced straight into the host's fp32 partition
        return 0
    return weight * partition(total, work)


def _state_bytes_per_param(work: Workload) -> int:
    master = 0 if work.precision == "fp32" else FP32
    states = SGD_STATES if work.optimizer == "sgd" else ADAM_STATES
    return master + states


def optimizer_bytes(work: Workload, layout: Layout) -> int:
    """fp32 master weights (mixed precision) and optimizer states, on the device."""
    if layout.offload_optimizer:
        return 0
    per_param = _state_bytes_per_param(work)
    if layout.stage == 0:
        return per_param * work.shape.parameters
    return per_param * partition(work.shape.parameters, work)


def buffer_bytes(work: Workload, layout: Layout) -> int:
    """Gradient-reduction buckets and, under ZeRO-3, the gathered parameters in flight."""
    knobs, weight = layout.knobs, work.weight_bytes
    if layout.stage == 0:
        return weight * min(work.shape.parameters, knobs.allgather_bucket_size)
    buckets = 2 if knobs.overlap_comm else 1
    reduce = buckets * weight * knobs.reduce_bucket_size
    if layout.stage < 3:
        return reduce
    return reduce + weight * gathered_params(work, layout)


def gathered_params(work: Workload, layout: Layout) -> int:
    """Parameters gathered at once under ZeRO-3: the module in use plus the prefetch."""
    knobs, shape = layout.knobs, work.shape
    in_flight = 2 * shape.largest_module_params + knobs.prefetch_bucket_size
    return min(in_flight, knobs.max_live_parameters + shape.largest_module_params, shape.parameters)


def activation_bytes(work: Workload, layout: Layout, calibration: Calibration) -> int:
    """Activations kept for backward at the end of the forward pass, logits included."""
    constants, shape = calibration.activations, work.shape
    tokens = layout.micro_batch * work.sequence_length
    one_block = block_activation_bytes(work, tokens, calibration)
    if layout.checkpointing:
        kept = shape.layers * tokens * shape.hidden * constants.checkpointed_per_hidden
        blocks = kept * work.weight_bytes + one_block  # plus one block being recomputed
    else:
        blocks = shape.layers * one_block
    logits = tokens * shape.vocab * constants.logits_bytes_per_vocab
    embeddings = tokens * shape.hidden * constants.embedding_per_hidden * work.weight_bytes
    return int(blocks + logits + embeddings)


def block_activation_bytes(work: Workload, tokens: int, calibration: Calibration) -> float:
    constants, shape = calibration.activations, work.shape
    elements = constants.per_hidden * shape.hidden + constants.per_ffn * shape.ffn
    if not shape.flash_attention:
        elements += constants.eager_scores_per_head_token * shape.heads * work.sequence_length
    return tokens * elements * work.weight_bytes


def step_temporary_bytes(work: Workload, layout: Layout, calibration: Calibration) -> int:
    """Device memory only the optimizer step needs: the fp32 gradients and the update's scratch."""
    if layout.offload_optimizer:
        return 0  # the step runs on the host
    constants = calibration.step
    numel = work.shape.parameters if layout.stage == 0 else partition(work.shape.parameters, work)
    scratch = (
        constants.torch_adam_partitions
        if work.optimizer_impl == "torch"
        else constants.fused_adam_partitions
    )
    upcast = constants.fp32_grad_partitions if work.precision != "fp32" else 0.0
    return int(FP32 * numel * (scratch + upcast))


def overhead_bytes(work: Workload, dynamic: int, calibration: Calibration) -> int:
    constants = calibration.overhead
    if work.on_cpu:
        return constants.cpu_process_bytes + int(constants.cpu_fragmentation * dynamic)
    return constants.gpu_context_bytes + int(constants.gpu_fragmentation * dynamic)


def offloaded_bytes_per_rank(work: Workload, layout: Layout) -> int:
    """What one rank keeps on the host under offload: fp32 states, gradients, parameters."""
    if not layout.offload_optimizer:
        return 0
    numel = partition(work.shape.parameters, work)
    per_param = _state_bytes_per_param(work) + FP32  # plus the fp32 gradient partition
    host = _pinned(per_param * numel, layout)
    if layout.offload_param:
        host += _pinned(work.weight_bytes * numel, layout)
    return host


def _pinned(nbytes: int, layout: Layout) -> int:
    """PyTorch's pinned-memory allocator rounds each block up to a power of two."""
    if not layout.knobs.pin_memory or nbytes <= 0:
        return nbytes
    return 1 << (nbytes - 1).bit_length()


def host_bytes_per_node(work: Workload, layout: Layout, offloaded_per_rank: int) -> int:
    """Host memory per node: offloaded state, or at least each rank building the fp32 model."""
    model_build = FP32 * work.shape.parameters
    return work.gpus_per_node * max(model_build, offloaded_per_rank)
