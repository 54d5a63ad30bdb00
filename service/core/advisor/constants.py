"""The memory model's constants, each marked with where its value comes from.

``CPU-measured``: fitted by ``bench/advisor_calibrate.py`` to real 2-rank DeepSpeed 0.19.8 runs on
the CPU of the development machine (see docs/advisor.md). ``literature``: from papers or the
DeepSpeed/PyTorch source, not yet checked on a GPU here. GPU calibration is pending.
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
class Overhead:
    """What the device holds beyond tensors: runtime context and allocator slack."""

    gpu_context_bytes: int = 600 * MIB  # literature: CUDA context + cuBLAS/NCCL workspaces
    cpu_process_bytes: int = 489 * MIB  # CPU-measured: resident memory beyond tensors, envelope
    gpu_fragmentation: float = 0.08  # literature: caching-allocator slack on transient tensors
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
    overhead: Overhead = Overhead()
    speeds: Speeds = Speeds()


CALIBRATION = Calibration()
DEFAULT_HEADROOM = 0.10  # keep 10% of the device free for spikes the model does not see
