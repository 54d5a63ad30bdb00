"""Relative step cost of a layout: 1.0 is pure compute at full efficiency, more is slower.

It adds what each memory saving costs in time: gradient/parameter communication by ZeRO stage
(ZeRO-2 reduces every micro-step, ZeRO-3 also gathers parameters twice per micro-step), the
forward pass recomputed under checkpointing, PCIe traffic and the host step under offload, and
the lower utilisation of small micro-batches. Only the ordering and rough ratios are meant.
"""

from __future__ import annotations

from service.core.advisor.constants import CALIBRATION, Calibration
from service.core.advisor.layout import Layout, Workload

RECOMPUTE = 4 / 3  # forward recomputed: 8 instead of 6 FLOPs per parameter and token


def relative_cost(work: Workload, layout: Layout, calibration: Calibration = CALIBRATION) -> float:
    ideal = compute_seconds(work, work.per_rank_batch, calibration) / work.per_rank_batch
    step = compute_seconds(work, layout.micro_batch, calibration) * layout.accumulation
    if layout.checkpointing:
        step *= RECOMPUTE
    step += communication_bytes(work, layout) / network_bytes_per_s(work, calibration)
    step += offload_seconds(work, layout, calibration)
    per_sample = step / work.per_rank_batch
    return round(per_sample / ideal, 3) if ideal > 0 else 1.0


def compute_seconds(work: Workload, micro_batch: int, calibration: Calibration) -> float:
    """One micro-step's forward and backward, slower when the micro-batch is small."""
    speeds = calibration.speeds
    tokens = micro_batch * work.sequence_length
    efficiency = tokens / (tokens + speeds.half_efficiency_tokens)
    return 6 * work.shape.parameters * tokens / (speeds.device_flops * efficiency)


def communication_bytes(work: Workload, layout: Layout) -> float:
    """Bytes each rank sends per optimizer step (ring collectives)."""
    if work.world_size == 1:
        return 0.0
    model = work.weight_bytes * work.shape.parameters * (work.world_size - 1) / work.world_size
    if layout.stage <= 1:
        return 2 * model  # one all-reduce at the accumulation boundary
    if layout.stage == 2:
        return model * layout.accumulation + model  # reduce-scatter per micro-step, one gather
    return 3 * model * layout.accumulation  # gather forward, gather backward, reduce-scatter


def network_bytes_per_s(work: Workload, calibration: Calibration) -> float:
    speeds = calibration.speeds
    return speeds.inter_node_bytes_per_s if work.nodes > 1 else speeds.intra_node_bytes_per_s


def offload_seconds(work: Workload, layout: Layout, calibration: Calibration) -> float:
    """PCIe traffic and the host optimizer step that offload adds to every step."""
    if not layout.offload_optimizer:
        return 0.0
    speeds = calibration.speeds
    numel = -(-work.shape.parameters // work.world_size)
    traffic = 2 * work.weight_bytes * numel  # gradients out, updated parameters back
    if layout.offload_param:  # parameters cross PCIe forward and backward every micro-step
        traffic += 2 * work.weight_bytes * numel * layout.accumulation
    return traffic / speeds.pcie_bytes_per_s + numel / speeds.cpu_adam_params_per_s
