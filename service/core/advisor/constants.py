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
    """Rough throughput figures for the relative cost; only ratios matter."""

    device_flops: float = 4.0e14  # literature: H100 bf16 at ~40% utilisation
    intra_node_bytes_per_s: float = 1.5e11  # literature: NVLink-class all-reduce bus bandwidth
    inter_node_bytes_per_s: float = 2.5e10  # literature: 200 Gb/s InfiniBand per GPU
    pcie_bytes_per_s: float = 2.0e10  # literature: PCIe 4.0 x16 in practice
    cpu_adam_params_per_s: float = 1.0e9  # literature: DeepSpeedCPUAdam on a multi-core host
    half_efficiency_tokens: float = 1024.0  # literature: tokens per micro-step at 50% utilisation


@dataclass(frozen=True)
class Calibration:
    activations: Activations = Activations()
    step: Step = Step()
    gpu_activations: GpuActivations = GpuActivations()
    gpu_step: GpuStep = GpuStep()
    overhead: Overhead = Overhead()
    speeds: Speeds = Speeds()


CALIBRATION = Calibration()
DEFAULT_HEADROOM = 0.10  # keep 10% of the device free for spikes the model does not see
