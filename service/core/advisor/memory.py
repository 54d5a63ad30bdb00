"""The memory model: per-GPU bytes of one layout at its peak, by what holds them.

A training step has three candidate peaks, and the measured runs (docs/advisor.md) put the
step's peak in each: the end of forward (every activation kept for backward), the end of
backward (gradients being reduced, communication buckets, gathered ZeRO-3 parameters) and the
optimizer step (fp32 gradient partitions and the update's scratch tensors). All three are
computed on top of what every step holds (16-bit parameters, fp32 master weights and optimizer
states, ZeRO-3's gradient partition and bucket) and the largest is reported, so that ``total``
is the sum of the fields. What each ZeRO
stage allocates follows DeepSpeed 0.19.8 as measured on the CPU; the sizes are per rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from service.core.advisor.constants import CALIBRATION, Calibration
from service.core.advisor.gpu_memory import gpu_activation_bytes, gpu_step_transient
from service.core.advisor.init_memory import initialize_tensor_bytes
from service.core.advisor.layout import Layout, Workload
from service.core.advisor.models import PeakPhase, PerGpuBytes
from service.core.advisor.shape import ModelShape

FP32 = 4
ADAM_STATES = 8  # exp_avg and exp_avg_sq in fp32
SGD_STATES = 4  # momentum in fp32
ALLREDUCE_BUCKET = 500_000_000  # DeepSpeed's ZeRO-0 all-reduce bucket, in elements


@dataclass(frozen=True)
class Phase:
    gradients: int
    buffers: int
    activations: int
    temporaries: int

    def transient(self) -> int:
        return self.gradients + self.buffers + self.activations + self.temporaries


@dataclass(frozen=True)
class Prediction:
    per_gpu: PerGpuBytes
    cpu_bytes_per_node: int
    phase: PeakPhase  # where the peak is
    initialize_bytes: int = 0  # the peak inside deepspeed.initialize, CUDA context included


def predict_memory(
    work: Workload, layout: Layout, calibration: Calibration = CALIBRATION
) -> Prediction:
    """Predicted peak per GPU and host memory per node for one layout."""
    host = offloaded_bytes_per_rank(work, layout)
    params = param_bytes(work, layout)
    optimizer = optimizer_bytes(work, layout) + (host if work.on_cpu else 0)
    phases: dict[PeakPhase, Phase] = {
        "forward": forward_phase(work, layout, calibration),
        "backward": backward_phase(work, layout, calibration),
        "step": step_phase(work, layout, calibration),
    }
    phase = max(phases, key=lambda name: phases[name].transient())
    peak = phases[phase]
    dynamic = params + optimizer + peak.transient()
    held = params + optimizer + held_gradients(work, layout) + held_bucket_bytes(work, layout)
    overhead = overhead_bytes(work, dynamic, held, lazy_state_bytes(work, layout), calibration)
    per_gpu = PerGpuBytes.model_construct(
        params=params,
        gradients=peak.gradients,
        optimizer=optimizer,
        activations=peak.activations,
        buffers=peak.buffers,
        temporaries=peak.temporaries,
        overhead=overhead,
        total=dynamic + overhead,
    )
    first_step = params + optimizer + phases["step"].transient()
    init = initialize_bytes(work, layout, params, first_step, calibration)
    if init > per_gpu.total:  # the wrappers' flat copies outgrow every training phase
        phase = "initialize"
        per_gpu = initialize_breakdown(work, layout, params, init, calibration)
    return Prediction(per_gpu, host_bytes_per_node(work, layout, host), phase, init)


def initialize_breakdown(
    work: Workload, layout: Layout, params: int, init: int, calibration: Calibration
) -> PerGpuBytes:
    """The initialize peak by what holds it: the fp32 master partition as the optimizer, the
    flat 16-bit copies as temporaries, the CUDA context as overhead."""
    context = calibration.overhead.gpu_context_bytes
    master = 0 if layout.offload_optimizer else FP32 * partition(work.shape.parameters, work)
    gradients, buckets = held_gradients(work, layout), held_bucket_bytes(work, layout)
    rest = init - context - params - master - gradients - buckets
    return PerGpuBytes.model_construct(
        params=params,
        gradients=gradients,
        optimizer=master,
        activations=0,
        buffers=buckets,
        temporaries=max(0, rest),
        overhead=context,
        total=init,
    )


def initialize_bytes(
    work: Workload, layout: Layout, params: int, first_step: int, calibration: Calibration
) -> int:
    """The peak inside deepspeed.initialize with the CUDA context (0 on CPU ranks: not
    measured there, and the CPU grid's peaks are training peaks)."""
    if work.on_cpu:
        return 0
    tensors = initialize_tensor_bytes(
        work,
        layout,
        params,
        held_gradients(work, layout),
        held_bucket_bytes(work, layout),
        first_step,
    )
    return tensors + calibration.overhead.gpu_context_bytes


def partition(numel: int, work: Workload) -> int:
    return -(-numel // work.world_size)


def persistent_params(work: Workload, layout: Layout) -> int:
    """ZeRO-3 keeps tensors under the persistence threshold whole on every rank."""
    return _persistent(work.shape, layout.knobs.param_persistence_threshold)


@cache
def _persistent(shape: ModelShape, threshold: int) -> int:
    return sum(n * count for n, count in shape.tensor_counts() if n < threshold)


def param_bytes(work: Workload, layout: Layout) -> int:
    """16-bit parameters: whole below ZeRO-3; a partition plus the persistent ones under it."""
    total, weight = work.shape.parameters, work.weight_bytes
    if layout.stage < 3:
        return weight * total
    sharded = 0 if layout.offload_param else partition(total, work)
    return weight * (sharded + persistent_params(work, layout))


def _state_bytes_per_param(work: Workload, stage: int) -> int:
    """fp32 master weights plus optimizer states; ZeRO keeps its own fp32 partition even in fp32
    training (measured), ZeRO-0 in fp32 updates the parameters themselves."""
    master = 0 if work.precision == "fp32" and stage == 0 else FP32
    states = SGD_STATES if work.optimizer == "sgd" else ADAM_STATES
    return master + states


def optimizer_bytes(work: Workload, layout: Layout) -> int:
    """fp32 master weights (mixed precision) and optimizer states kept on the device."""
    if layout.offload_optimizer:
        return 0
    per_param = _state_bytes_per_param(work, layout.stage)
    if layout.stage == 0:
        return per_param * work.shape.parameters
    return per_param * partition(work.shape.parameters, work)


def held_gradients(work: Workload, layout: Layout) -> int:
    """ZeRO-3 keeps a 16-bit gradient partition between steps; lower stages free theirs. On a
    GPU under optimizer offload it lives on the host (stage3.py: ``self.device`` is the CPU;
    the H200 run holds 0.93 GiB after init, the bucket alone)."""
    if layout.stage != 3 or (layout.offload_optimizer and not work.on_cpu):
        return 0
    return work.weight_bytes * partition(work.shape.parameters, work)


def unreduced_gradient_bytes(work: Workload, layout: Layout) -> int:
    """16-bit gradients alive before reduction: all of them at ZeRO-0, at most a bucket's worth
    above (measured: whole at 2 and 4 ranks while the model fits one bucket)."""
    total = work.shape.parameters
    if layout.stage == 0:
        return work.weight_bytes * total
    return work.weight_bytes * min(total, layout.knobs.reduce_bucket_size)


def fp32_gradient_bytes(work: Workload, layout: Layout) -> int:
    """The fp32 gradients the update reads: whole at ZeRO-0, this rank's partition above (kept
    on the host under offload, counted there)."""
    if layout.offload_optimizer:
        return 0
    if layout.stage == 0:
        return FP32 * work.shape.parameters if work.precision != "fp32" else 0
    return FP32 * partition(work.shape.parameters, work)


def forward_phase(work: Workload, layout: Layout, calibration: Calibration) -> Phase:
    """Start of backward: every activation kept for backward, next to the reduction buckets
    (allocated as backward begins; ZeRO-0's all-reduce buffer too, as measured) and ZeRO-3's
    gathered parameters."""
    if not work.on_cpu:  # H200: no reduction bucket is allocated before the first gradient
        return Phase(
            gradients=held_gradients(work, layout),
            buffers=held_bucket_bytes(work, layout) + gathered_bytes(work, layout),
            activations=gpu_activation_bytes(work, layout, calibration),
            temporaries=0,
        )
    return Phase(
        gradients=held_gradients(work, layout),
        buffers=bucket_bytes(work, layout) + gathered_bytes(work, layout),
        activations=activation_bytes(work, layout, calibration),
        temporaries=0,
    )


def backward_phase(work: Workload, layout: Layout, calibration: Calibration) -> Phase:
    """End of backward: gradients produced and reduced, buckets in flight, the last logits."""
    gradients = held_gradients(work, layout) + unreduced_gradient_bytes(work, layout)
    if not work.on_cpu and layout.stage in (1, 2) and not layout.offload_optimizer:
        # stage_1_and_2.py get_flat_partition: the flat 16-bit partition beside the grads
        gradients += work.weight_bytes * partition(work.shape.parameters, work)
    return Phase(
        gradients=gradients,
        buffers=bucket_bytes(work, layout) + gathered_bytes(work, layout),
        activations=kept_logits_bytes(work, layout, calibration) if work.on_cpu else 0,
        temporaries=0,
    )


def step_phase(work: Workload, layout: Layout, calibration: Calibration) -> Phase:
    """The optimizer step: fp32 gradients, the update's scratch, the loop's last logits."""
    if not work.on_cpu:  # the loop keeps no logits (the probe reads only .loss)
        gradients, scratch = gpu_step_transient(work, layout, calibration)
        return Phase(
            gradients=held_gradients(work, layout) + gradients,
            buffers=held_bucket_bytes(work, layout),
            activations=0,
            temporaries=scratch,
        )
    gradients = held_gradients(work, layout) + fp32_gradient_bytes(work, layout)
    if layout.stage == 0:
        gradients += work.weight_bytes * work.shape.parameters
    return Phase(
        gradients=gradients,
        buffers=held_bucket_bytes(work, layout),
        activations=kept_logits_bytes(work, layout, calibration),
        temporaries=step_temporary_bytes(work, layout, calibration),
    )


def bucket_bytes(work: Workload, layout: Layout) -> int:
    """Gradient-reduction buckets; DeepSpeed allocates each whole, two with overlap_comm."""
    knobs = layout.knobs
    if layout.stage == 0:  # the engine flattens gradients into one all-reduce buffer
        return work.weight_bytes * min(work.shape.parameters, ALLREDUCE_BUCKET)
    if layout.stage == 3:
        return held_bucket_bytes(work, layout)
    count = 2 if knobs.overlap_comm else 1
    return count * work.weight_bytes * knobs.reduce_bucket_size


def held_bucket_bytes(work: Workload, layout: Layout) -> int:
    """ZeRO-3 keeps its reduction bucket allocated between steps."""
    if layout.stage != 3:
        return 0
    return work.weight_bytes * layout.knobs.reduce_bucket_size


def gathered_bytes(work: Workload, layout: Layout) -> int:
    """ZeRO-3 parameters gathered at once: the module in use plus the prefetch."""
    if layout.stage != 3:
        return 0
    knobs, shape = layout.knobs, work.shape
    in_flight = 2 * shape.largest_module_params + knobs.prefetch_bucket_size
    limit = knobs.max_live_parameters + shape.largest_module_params
    if not work.on_cpu and (work.world_size > 1 or layout.offload_param):
        # gathered parameters stay while reused within stage3_max_reuse_distance (backward and
        # checkpointing's recompute reuse every block's) up to stage3_max_live_parameters: the
        # H200 run with parameter offload holds that much more at the start of backward (one
        # GPU without parameter offload gathers nothing: its partition is the whole tensor)
        in_flight = limit
    return work.weight_bytes * min(in_flight, limit, shape.parameters)


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


def kept_logits_bytes(work: Workload, layout: Layout, calibration: Calibration) -> int:
    """A training loop still holds its last logits (16-bit) while the optimizer steps."""
    tokens = layout.micro_batch * work.sequence_length
    return int(tokens * work.shape.vocab * calibration.activations.kept_logits_bytes_per_vocab)


def step_temporary_bytes(work: Workload, layout: Layout, calibration: Calibration) -> int:
    """Scratch tensors of the update, in fp32 partitions (on the host under offload)."""
    if layout.offload_optimizer and not work.on_cpu:
        return 0
    constants = calibration.step
    # ZeRO-0 steps tensor by tensor; ZeRO-1/2/3 step one flat fp32 partition
    numel = (
        work.shape.largest_tensor if layout.stage == 0 else partition(work.shape.parameters, work)
    )
    if work.optimizer_impl == "torch":
        scratch = constants.torch_adam_partitions
    else:
        scratch = constants.fused_adam_partitions
    return int(FP32 * numel * scratch)


def lazy_state_bytes(work: Workload, layout: Layout) -> int:
    """Optimizer states on the device that the first step creates among its transients: every
    wrapped optimizer but ZeRO-0's FP16_Optimizer, whose initialize_optimizer_states steps once
    at init (the H200 runs: 14 bytes/parameter after init at ZeRO-0 in bf16, 6 at ZeRO-1/2)."""
    if layout.offload_optimizer or (layout.stage == 0 and work.precision != "fp32"):
        return 0
    states = SGD_STATES if work.optimizer == "sgd" else ADAM_STATES
    numel = work.shape.parameters if layout.stage == 0 else partition(work.shape.parameters, work)
    return states * numel


def overhead_bytes(
    work: Workload, dynamic: int, held: int, lazy_states: int, calibration: Calibration
) -> int:
    """Beyond the tensors: on CPU ranks the process and what glibc keeps; on a GPU the CUDA
    context and what the caching allocator reserves beyond the allocated peak."""
    constants = calibration.overhead
    if work.on_cpu:
        return constants.cpu_process_bytes + int(constants.cpu_fragmentation * dynamic)
    reserved = constants.gpu_reserved_per_transient * (dynamic - held)
    reserved += constants.gpu_reserved_per_lazy_state * lazy_states
    return constants.gpu_context_bytes + int(reserved)


def offloaded_bytes_per_rank(work: Workload, layout: Layout) -> int:
    """What one rank keeps on the host under offload: fp32 states, gradients, parameters."""
    if not layout.offload_optimizer:
        return 0
    numel = partition(work.shape.parameters, work)
    per_param = _state_bytes_per_param(work, layout.stage) + FP32  # and the fp32 gradients
    host = _pinned(per_param * numel, work, layout)
    if layout.stage < 3:  # 16-bit staging: a partition and two tensor-sized buffers (measured)
        staging = work.weight_bytes * (numel + 2 * work.shape.largest_tensor)
        host += _pinned(staging, work, layout)
    if layout.offload_param:
        host += _pinned(work.weight_bytes * numel, work, layout)
    if layout.stage == 3 and not work.on_cpu:  # the 16-bit gradient partition (stage3.py)
        host += _pinned(work.weight_bytes * numel, work, layout)
    return host


def _pinned(nbytes: int, work: Workload, layout: Layout) -> int:
    """PyTorch's pinned-memory allocator rounds each block up to a power of two (CUDA hosts
    only: DeepSpeed's CPU accelerator does not pin)."""
    if work.on_cpu or not layout.knobs.pin_memory or nbytes <= 0:
        return nbytes
    return 1 << (nbytes - 1).bit_length()


def host_bytes_per_node(work: Workload, layout: Layout, offloaded_per_rank: int) -> int:
    """Host memory per node: offloaded state, or at least each rank building the fp32 model."""
    model_build = FP32 * work.shape.parameters
    return work.gpus_per_node * max(model_build, offloaded_per_rank)
