"""The step-time model: how long one optimizer step of a layout takes, predicted before any run.

A step is ``accumulation`` micro-steps and one update. In a micro-step the device computes the
forward and backward (three forward passes' FLOPs, a fourth of the blocks under checkpointing)
at an efficiency that grows with the tokens per micro-step, while the host launches the kernels
and runs DeepSpeed's hooks; the two overlap, so the micro-step takes the longer of them. ZeRO-3's
hooks run on the host for every module in every pass (``fetch_sub_module`` / ``release_sub_module``)
and for every parameter's gradient: on a small model they, not the device, set the pace, which is
why ZeRO-3 is slower than ZeRO-0 on one GPU with no network at all. Then, in series: the update
(bytes through device memory, or PCIe and the host's optimizer under offload), ZeRO-0's overflow
check (a host synchronisation per gradient tensor), and the communication the backward does not
hide. Constants and their sources: constants.py ``Speeds``, hardware.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.core.advisor.constants import CALIBRATION, Calibration, Speeds
from service.core.advisor.hardware import Hardware
from service.core.advisor.layout import Layout, Workload

HOOKED_CONTAINERS = 4  # per Llama/GPT block: the block, its attention, its MLP, the activation
OUTER_MODULES = 6  # the model, its trunk, embeddings, final norm, rotary/positions, the head


@dataclass(frozen=True)
class StepTime:
    """Predicted seconds of one optimizer step, and the job's tokens per second at that pace."""

    seconds: float
    tokens_per_second: float
    device_seconds: float  # compute and memory traffic of the micro-steps
    host_seconds: float  # kernel launches and DeepSpeed hooks of the micro-steps
    serial_seconds: float  # update, synchronisations, exposed communication, offload


def predict_step_time(
    work: Workload, layout: Layout, calibration: Calibration = CALIBRATION
) -> StepTime:
    speeds, hw = calibration.speeds, work.hardware
    device = micro_device_seconds(work, layout, speeds, hw)
    host = micro_host_seconds(work, layout, speeds)
    exposed_comm = micro_comm_seconds(work, layout, speeds, hw) - overlap_window(layout, device)
    exposed_comm = max(0.0, exposed_comm)
    micro = max(device, host) + exposed_comm
    serial = update_seconds(work, layout, speeds, hw) + overflow_check_seconds(work, layout, speeds)
    serial += boundary_comm_seconds(work, layout, speeds, hw)
    seconds = layout.accumulation * micro + serial
    tokens = work.global_batch * work.sequence_length
    return StepTime(seconds, tokens / seconds, device, host, serial)


def efficiency(tokens: int, speeds: Speeds) -> float:
    """Share of the device's peak a micro-step of this many tokens reaches."""
    return speeds.mfu_max * tokens / (tokens + speeds.half_efficiency_tokens)


def micro_device_seconds(work: Workload, layout: Layout, speeds: Speeds, hw: Hardware) -> float:
    tokens = layout.micro_batch * work.sequence_length
    whole, blocks = work.forward_flops_per_token
    flops = (3.0 * whole + (blocks if layout.checkpointing else 0.0)) * tokens
    compute = flops / (hw.peak_flops * efficiency(tokens, speeds))
    return compute + gather_seconds(work, layout, speeds, hw)


def zero3_passes(layout: Layout) -> int:
    """Times ZeRO-3 gathers every parameter in a micro-step: forward, backward, a recompute."""
    return 3 if layout.checkpointing else 2


def gather_seconds(work: Workload, layout: Layout, speeds: Speeds, hw: Hardware) -> float:
    """ZeRO-3's parameter gathers: over PCIe from the host under parameter offload, else into a
    full buffer (one GPU: a copy in device memory; more: the ring's share over the link)."""
    if layout.stage != 3:
        return 0.0
    model = work.weight_bytes * work.shape.parameters * zero3_passes(layout)
    if layout.offload_param:
        return model / work.world_size / hw.pcie_bytes_per_s
    if work.world_size == 1:
        return 2.0 * model / (hw.memory_bytes_per_s * speeds.memory_efficiency)
    return model * ring_share(work) / link_bytes_per_s(work, speeds, hw)


def micro_host_seconds(work: Workload, layout: Layout, speeds: Speeds) -> float:
    """Kernel launches of every block pass (the head and loss count as one more block) and, at
    ZeRO-3, the module and gradient hooks DeepSpeed runs on the host."""
    shape = work.shape
    passes = 4 if layout.checkpointing else 3
    host = speeds.host_seconds_per_block_pass * (shape.layers + 1) * passes
    if layout.stage == 3:
        modules = shape.layers * (len(shape.block_tensors) + HOOKED_CONTAINERS) + OUTER_MODULES
        hooks = modules * zero3_passes(layout) + work.parameter_tensors
        host += speeds.host_seconds_per_zero3_hook * hooks
    return host


def update_seconds(work: Workload, layout: Layout, speeds: Speeds, hw: Hardware) -> float:
    """The optimizer step on this rank's partition: device memory traffic, or under offload the
    gradients out and the parameters back over PCIe and the host optimizer."""
    numel = (
        work.shape.parameters if layout.stage == 0 else -(-work.shape.parameters // work.world_size)
    )
    if layout.offload_optimizer:
        pcie = (4 + work.weight_bytes) * numel / hw.pcie_bytes_per_s  # fp32 grads out, params back
        rate = (
            speeds.host_torch_adam_params_per_s
            if work.optimizer_impl == "torch"
            else speeds.host_cpu_adam_params_per_s
        )
        return pcie + numel / rate
    per_element = speeds.wrapper_bytes + optimizer_bytes(work, speeds)
    return per_element * numel / (hw.memory_bytes_per_s * speeds.memory_efficiency)


def optimizer_bytes(work: Workload, speeds: Speeds) -> float:
    if work.optimizer == "sgd":
        return speeds.sgd_bytes
    return speeds.torch_adam_bytes if work.optimizer_impl == "torch" else speeds.fused_adam_bytes


def overflow_check_seconds(work: Workload, layout: Layout, speeds: Speeds) -> float:
    """ZeRO-0 in 16-bit (FP16_Optimizer.step -> CheckOverflow.has_overflow_serial) tests each
    gradient for inf/NaN and reads the answer on the host: one synchronisation per tensor, with
    nothing queued behind it. ZeRO-1/2/3 sum the tests on the device and read once."""
    if layout.stage != 0 or work.precision == "fp32" or work.on_cpu:
        return speeds.host_sync_seconds
    return speeds.host_sync_seconds * work.parameter_tensors


def ring_share(work: Workload) -> float:
    return (work.world_size - 1) / work.world_size


def link_bytes_per_s(work: Workload, speeds: Speeds, hw: Hardware) -> float:
    link = hw.inter_node_bytes_per_s if work.nodes > 1 else hw.intra_node_bytes_per_s
    return link * speeds.link_efficiency


def micro_comm_seconds(work: Workload, layout: Layout, speeds: Speeds, hw: Hardware) -> float:
    """Gradient reduction inside each micro-step: ZeRO-2 and ZeRO-3 reduce-scatter every
    micro-step (ZeRO-3's gathers are in ``gather_seconds``); ZeRO-0/1 wait for the boundary."""
    if work.world_size == 1 or layout.stage < 2:
        return 0.0
    model = work.weight_bytes * work.shape.parameters
    return model * ring_share(work) / link_bytes_per_s(work, speeds, hw)


def overlap_window(layout: Layout, device_seconds: float) -> float:
    """How much communication the device's work hides: with overlap_comm the reduction runs on
    its own stream during backward (two thirds of the compute); without it, none."""
    return device_seconds * 2.0 / 3.0 if layout.knobs.overlap_comm else 0.0


def boundary_comm_seconds(work: Workload, layout: Layout, speeds: Speeds, hw: Hardware) -> float:
    """At the accumulation boundary: ZeRO-0's all-reduce of every gradient (after backward, not
    overlapped), ZeRO-1's reduce-scatter, and ZeRO-1/2's all-gather of updated parameters."""
    if work.world_size == 1 or layout.stage == 3:
        return 0.0
    model = work.weight_bytes * work.shape.parameters * ring_share(work)
    collectives = 2.0 if layout.stage < 2 else 1.0
    return collectives * model / link_bytes_per_s(work, speeds, hw)
