"""The memory model's constants, each marked with where its value comes from.

``CPU-measured``: fitted by ``bench/advisor_calibrate.py`` to real 2-rank DeepSpeed 0.19.8 runs on
the CPU of the development machine. ``code``: read from the DeepSpeed 0.19.8 / torch /
transformers source that allocates. ``H200``: confirmed or fitted on the 44 real runs in
bench/data/h200_runs.jsonl (one H200, bf16, Llama). ``literature``: from papers, not checked
here. docs/advisor.md lists each with its source.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024**2
GIB = 1024**3


@dataclass(frozen=True)
class Activations:
    """Elements kept for backward, per token and transformer block."""

    per_hidden: float = 8.08  # CPU-measured (bench/advisor_fit.py); literature 8
    per_ffn: float = 2.02  # CPU-measured, at the 8h:2f ratio of Korthikanti et al.
    eager_scores_per_head_token: float = 2.0  # literature: scores and softmax, s x s per head
    checkpointed_per_hidden: float = 1.0  # literature: the block input (fit: 0.00)
    logits_bytes_per_vocab: float = 5.17  # CPU-measured; literature 10
    embedding_per_hidden: float = 9.56  # CPU-measured
    kept_logits_bytes_per_vocab: float = 2.32  # CPU-measured: the loop's last logits


@dataclass(frozen=True)
class Step:
    """Optimizer-step temporaries, as multiples of the fp32 partition (4 bytes per element)."""

    torch_adam_partitions: float = 2.09  # CPU-measured: torch AdamW, whole-tensor scratch
    fused_adam_partitions: float = 0.0  # literature: FusedAdam works in place, chunk by chunk


@dataclass(frozen=True)
class GpuActivations:
    """Saved tensors on a CUDA device (bf16/fp16 elements unless said), per token."""

    # code + H200 (10.0 and 9.8 fitted): q, attention out, o_proj/qkv/MLP inputs, 2 RMSNorms
    per_hidden: float = 10.0
    per_kv: float = 2.0  # code (SDPA saves k and v): H200 runs llama-134m vs llama-1.1b (GQA)
    gated_per_ffn: float = 4.0  # code (LlamaMLP): gate, SiLU(gate), up, their product
    plain_per_ffn: float = 2.0  # code (GELU MLP): up and GELU(up); not GPU-measured
    eager_scores_per_head_token: float = 3.0  # code: fp32 softmax and its 16-bit copy, s x s
    loss_bytes_per_vocab: float = 12.0  # code (ForCausalLMLoss): 3 fp32 logits in its backward
    # H200 llama-134m Z1/Z3 +ckpt mb=4 s=2048: the final norm and the head's input
    outer_bytes_per_hidden: float = 18.9


@dataclass(frozen=True)
class GpuStep:
    """fp32 copies of the stepped elements the update makes on a CUDA device."""

    # torch adam.py _multi_tensor_adam (_foreach_sqrt); H200 ZeRO-1/2: 22.06 bytes/parameter
    torch_foreach_copies: float = 1.0
    fused_copies: float = 0.0  # DeepSpeed FusedAdam multi_tensor_apply updates in place


@dataclass(frozen=True)
class Overhead:
    """What the device holds beyond tensors: runtime context and allocator slack."""

    gpu_context_bytes: int = 600 * MIB  # literature: CUDA context + cuBLAS/NCCL workspaces; not in
    # the H200 data (torch's counters exclude it): bench/gpu_calibrate.py measures it
    cpu_process_bytes: int = 489 * MIB  # CPU-measured: resident memory beyond tensors, envelope
    # What the caching allocator reserves beyond the allocated peak: least squares over the 44
    # H200 runs' train_reserved against the predicted allocation (bench/advisor_fit_gpu.py)
    gpu_reserved_per_transient: float = 0.33  # H200: share of the bytes freed within a step
    gpu_reserved_per_lazy_state: float = 0.19  # H200: share of optimizer states created inside
    # the first step (torch/Fused Adam at ZeRO-1/2/3; FP16_Optimizer makes ZeRO-0's at init)
    cpu_fragmentation: float = 0.343  # CPU-measured: freed tensor memory glibc keeps resident


@dataclass(frozen=True)
class Speeds:
    """The step-time model's constants (step_time.py); the hardware's own figures are in
    hardware.py. ``H200-fitted``: solved from one run each (bench/advisor_fit_time.py);
    ``code``: counted in the DeepSpeed 0.19.8 / torch source."""

    mfu_max: float = 0.6  # literature: dense bf16 training of Llama-class models, ~55-60% MFU
    half_efficiency_tokens: float = 1024.0  # literature: tokens per micro-step at half of that
    memory_efficiency: float = 0.8  # literature: elementwise kernels reach ~80% of HBM peak
    # Host time to launch one transformer block's kernels once (forward = 1 pass, backward = 2,
    # a recompute = 1): H200-fitted on llama-134m ZeRO-0 mb=1 s=1024 alone (80.2 ms a step)
    host_seconds_per_block_pass: float = 1.87e-3
    # Host time of one ZeRO-3 module hook (pre/post forward and backward of every module, each
    # a fetch_sub_module/release_sub_module call, partitioned_param_coordinator.py), and of
    # each parameter's gradient hook: H200-fitted on llama-134m ZeRO-3 mb=1 s=1024 alone
    host_seconds_per_zero3_hook: float = 0.33e-3
    # A device-to-host read of one scalar (launch, copy, synchronize); literature ~20-40 us.
    # ZeRO-0's FP16_Optimizer pays one per gradient tensor (utils.py has_overflow_serial)
    host_sync_seconds: float = 30e-6
    # Bytes each element moves through device memory in the update (code): torch's foreach
    # AdamW (weight decay, lerp, mul+addcmul, sqrt, div, add, addcdiv: 80), FusedAdam's one
    # kernel (read p, g, m, v; write p, m, v: 28), SGD with momentum (20)
    torch_adam_bytes: float = 80.0
    fused_adam_bytes: float = 28.0
    sgd_bytes: float = 20.0
    # Around the update (code): 16-bit gradients to fp32 (6), the clip's norm and scale (12),
    # fp32 back to 16-bit parameters (6), the flatten or bucket copies (8-12): ~36 on every path
    wrapper_bytes: float = 36.0
    # torch.optim.AdamW stepping on the host (torch_adam with offload): H200-fitted on
    # llama-1.1b ZeRO-2+offload(opt)+ckpt mb=4 s=2048 (3.06 s a step, one neighbour)
    host_torch_adam_params_per_s: float = 4.0e8  # 3.96e8 solved
    host_cpu_adam_params_per_s: float = 1.0e9  # literature: DeepSpeedCPUAdam, multi-core host
    # Share of the hardware table's collective bandwidths a cluster's links reach: 1.0 is the
    # table (spec sheet x 0.8); a cluster's calibration (calibration.py) may lower it
    link_efficiency: float = 1.0


@dataclass(frozen=True)
class Calibration:
    activations: Activations = Activations()
    step: Step = Step()
    gpu_activations: GpuActivations = GpuActivations()
    gpu_step: GpuStep = GpuStep()
    overhead: Overhead = Overhead()
    speeds: Speeds = Speeds()


CALIBRATION = Calibration()
# What the budget keeps free. Host memory and CPU ranks: a fixed 10% (the CPU grid's worst
# error is +15.5%, the model errs on the safe side there). A GPU: the memory model's measured
# error on the 44 H200 runs (bench/advisor_headroom.py): it never predicts more than 0.88 GiB
# (llama-134m ZeRO-3 mb=1 s=1024, allocator segments) nor more than 0.32% (runs above 16 GiB)
# below what the run really reserved, so a GPU keeps 1 GiB plus 1% free, or 10% where that is
# less. Under optimizer offload the model's error is not smaller (3.9% and 8.4% on the two
# offload runs), so those plans keep 10%. ``None`` as a headroom means this rule; a number is a
# fixed share.
FIXED_HEADROOM = 0.10
GPU_ERROR_BYTES = GIB  # 0.88 GiB measured, rounded up
GPU_ERROR_SHARE = 0.01  # 0.32% measured, x3 for shapes not measured
DEFAULT_HEADROOM: float | None = None
