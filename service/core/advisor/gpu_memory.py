"""What a CUDA device holds that the CPU ranks do not: the GPU side of the memory model.

Derived from the code that allocates (DeepSpeed 0.19.8, torch 2.11-2.13, transformers 5.x) and
confirmed on the H200 runs in bench/data/h200_runs.jsonl (see docs/advisor.md):

- the optimizer step per implementation: torch's AdamW on CUDA takes the foreach path
  (``torch/optim/adam.py``, ``_multi_tensor_adam``: ``exp_avg_sq_sqrt = _foreach_sqrt(...)``, one
  fp32 copy of what it steps); FusedAdam's multi-tensor kernel updates in place; under optimizer
  offload the step runs on the host;
- how each ZeRO path feeds the step: ZeRO-0 in bf16/fp16 (``FP16_Optimizer`` over one flat fp32
  group, ``runtime/fp16/fused_optimizer.py`` ``step``: every gradient converted to fp32 and
  flattened while the 16-bit gradients are alive); ZeRO-1/2 (``stage_1_and_2.py`` ``step``: the
  16-bit partition converted to an fp32 partition); ZeRO-3 (``stage3.py``
  ``_prepare_fp32_grad_for_sub_group``: the same per sub-group of ``sub_group_size``);
- activations per architecture, with the loss's fp32 upcast of the logits (transformers'
  ``ForCausalLMLoss``: ``logits.float()``, then cross-entropy, whose backward holds three fp32
  copies of the logits at once).
"""

from __future__ import annotations

from service.core.advisor.constants import Calibration
from service.core.advisor.layout import Layout, Workload

FP32 = 4


def _numel_step_scratch(work: Workload, calibration: Calibration) -> float:
    """fp32 copies the update makes of what it steps: torch foreach one, FusedAdam none."""
    step = calibration.gpu_step
    return step.torch_foreach_copies if work.optimizer_impl == "torch" else step.fused_copies


def gpu_step_transient(work: Workload, layout: Layout, calibration: Calibration) -> tuple[int, int]:
    """(gradient bytes, scratch bytes) at the step's peak, beyond what every step holds."""
    if layout.offload_optimizer:
        return 0, 0
    w, scratch = work.weight_bytes, _numel_step_scratch(work, calibration)
    cast = 0 if w == FP32 else FP32  # a 16-bit gradient becomes a new fp32 tensor
    if layout.stage == 0:
        numel = work.shape.parameters
        if w == FP32:  # no wrapper: torch steps the module's own fp32 gradients
            return FP32 * numel, int(scratch * FP32 * numel)
        # FP16_Optimizer: 16-bit grads, their fp32 copies and the flat fp32 gradient, at once
        flatten = (w + FP32 + FP32) * numel
        update = (FP32 + scratch * FP32) * numel
        return (flatten, 0) if flatten >= update else (FP32 * numel, int(scratch * FP32 * numel))
    numel = _stepped_numel(work, layout)
    convert = (w + cast) * numel
    update = (FP32 + scratch * FP32) * numel
    if convert >= update:
        return int(convert), 0
    return FP32 * numel, int(scratch * FP32 * numel)


def _stepped_numel(work: Workload, layout: Layout) -> int:
    """Elements the step converts and updates at once: the partition, or at ZeRO-3 one
    sub-group (parameters join a sub-group until it reaches ``sub_group_size``)."""
    partition = -(-work.shape.parameters // work.world_size)
    if layout.stage < 3:
        return partition
    largest = -(-work.shape.largest_tensor // work.world_size)
    return min(partition, layout.knobs.sub_group_size + largest)


def gpu_activation_bytes(work: Workload, layout: Layout, calibration: Calibration) -> int:
    """Activations at the start of backward: the blocks' saved tensors (or their checkpointed
    inputs), the final norm and head input, and the loss's fp32 logits in its backward."""
    constants, shape = calibration.gpu_activations, work.shape
    tokens = layout.micro_batch * work.sequence_length
    one_block = gpu_block_bytes(work, tokens, calibration)
    outer = tokens * shape.hidden * constants.outer_bytes_per_hidden
    loss = tokens * shape.vocab * constants.loss_bytes_per_vocab
    if not layout.checkpointing:
        return int(shape.layers * one_block + outer + loss)
    inputs = shape.layers * tokens * shape.hidden * work.weight_bytes
    return int(inputs + outer + max(loss, one_block))  # the recomputed block comes after the loss


def gpu_block_bytes(work: Workload, tokens: int, calibration: Calibration) -> float:
    """One block's saved tensors: attention and norms per hidden and key/value unit, the MLP
    per intermediate unit (gated: gate, its SiLU, up and their product; plain: up and GELU) for
    each expert a token is routed to."""
    constants, shape = calibration.gpu_activations, work.shape
    per_ffn = constants.gated_per_ffn if shape.gated_mlp else constants.plain_per_ffn
    elements = (
        constants.per_hidden * shape.hidden
        + constants.per_kv * shape.kv_width
        + per_ffn * shape.ffn * shape.experts_per_token
    )
    if not shape.flash_attention:
        elements += constants.eager_scores_per_head_token * shape.heads * work.sequence_length
    return tokens * elements * work.weight_bytes
