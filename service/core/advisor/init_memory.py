"""The peak inside ``deepspeed.initialize``: what the optimizer wrappers allocate before a step.

Read from DeepSpeed 0.19.8 and confirmed on the H200 runs' ``init_peak`` (bench/advisor_check.py
prints the error per run):

- ZeRO-0 in 16-bit: ``FP16_Optimizer.__init__`` builds one flat fp32 master copy and then
  ``initialize_optimizer_states`` steps once with zero gradients, so the optimizer's states, the
  fp32 gradients and the update's scratch all exist at init: the first step's peak, already
  (the runs: 24.2 bytes per parameter at init, 24.1 in training);
- ZeRO-1/2 (``stage_1_and_2.py``): the module's 16-bit parameters, the flat 16-bit group made
  from them, a 16-bit clone of this rank's partition and its fp32 copy (10 bytes per parameter
  on one GPU, measured 10.0); under optimizer offload the fp32 side is on the host (4, measured
  4.0);
- ZeRO-3 (``stage3.py``): the 16-bit partition and the persistent parameters, the fp32
  partition, the 16-bit gradient partition and the reduction bucket (predicted 2.4% and 7.6%
  below the runs; 0.25 GiB, 21%, below under parameter offload).
"""

from __future__ import annotations

from service.core.advisor.layout import Layout, Workload

FP32 = 4


def initialize_tensor_bytes(
    work: Workload, layout: Layout, params: int, held_gradients: int, bucket: int, first_step: int
) -> int:
    """Tensor bytes at the peak of ``deepspeed.initialize`` on one GPU. ``first_step`` is the
    model's peak of the first step (ZeRO-0 in 16-bit steps once at init)."""
    total, w = work.shape.parameters, work.weight_bytes
    partition = -(-total // work.world_size)
    if layout.stage == 0:
        return first_step if w != FP32 else w * total
    if layout.stage < 3:
        flat = 2 * w * total  # the module's parameters and the flat group built from them
        if layout.offload_optimizer:
            return flat
        return flat + (w + FP32) * partition
    master = 0 if layout.offload_optimizer else FP32 * partition
    return params + master + held_gradients + bucket
