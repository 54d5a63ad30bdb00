"""Turn a JobSpec and a ClusterProfile into the facts the memory model works with.

Hardware numbers come from the profile; a spec asking for more GPUs per node or more nodes than
the cluster has is an error here, before any plan is made for hardware that does not exist.
"""

from __future__ import annotations

from service.core.advisor.constants import (
    DEFAULT_HEADROOM,
    FIXED_HEADROOM,
    GPU_ERROR_BYTES,
    GPU_ERROR_SHARE,
)
from service.core.advisor.hardware import Hardware, hardware_for
from service.core.advisor.layout import Workload
from service.core.advisor.models import GIB, ClusterTooSmall
from service.core.advisor.shape import resolve_shape
from service.core.clusters import ClusterProfile
from service.core.spec import JobSpec, OptimizerImpl


def build_workload(spec: JobSpec, profile: ClusterProfile) -> Workload:
    check_resources(spec, profile)
    training = spec.training
    return Workload(
        shape=resolve_shape(spec.model),
        sequence_length=training.sequence_length,
        global_batch=training.global_batch_size,
        precision=training.precision.value,
        optimizer=training.optimizer.value,
        optimizer_impl=resolve_optimizer_impl(spec, profile),
        nodes=spec.resources.nodes,
        gpus_per_node=spec.resources.gpus_per_node,
        on_cpu=runs_on_cpu(profile),
        hardware=profile_hardware(profile),
    )


def profile_hardware(profile: ClusterProfile) -> Hardware:
    """The accelerator's spec-sheet figures, with those the profile sets itself."""
    return hardware_for(
        profile.accelerator,
        peak_tflops=profile.peak_tflops,
        memory_gb_per_s=profile.memory_gb_per_s,
        intra_node_gb_per_s=profile.intra_node_gb_per_s,
        inter_node_gb_per_s=profile.inter_node_gb_per_s,
        pcie_gb_per_s=profile.pcie_gb_per_s,
    )


def runs_on_cpu(profile: ClusterProfile) -> bool:
    return profile.accelerator.strip().lower() == "cpu"


def resolve_optimizer_impl(spec: JobSpec, profile: ClusterProfile) -> str:
    """torch's AdamW on CPU ranks (no CUDA to build FusedAdam with), else what was asked."""
    impl = spec.training.optimizer_impl
    if runs_on_cpu(profile) or impl == OptimizerImpl.TORCH:
        return "torch"
    return "fused"


def check_resources(spec: JobSpec, profile: ClusterProfile) -> None:
    resources = spec.resources
    if resources.gpus_per_node > profile.gpus_per_node:
        raise ClusterTooSmall(
            f"resources.gpus_per_node ({resources.gpus_per_node}) exceeds the "
            f"{profile.gpus_per_node} per node that cluster '{profile.name}' offers"
        )
    if resources.nodes > profile.max_nodes:
        raise ClusterTooSmall(
            f"resources.nodes ({resources.nodes}) exceeds the {profile.max_nodes} nodes "
            f"that cluster '{profile.name}' allows"
        )


def budget_bytes(
    profile: ClusterProfile, headroom: float | None = DEFAULT_HEADROOM, *, offload: bool = False
) -> int:
    """Usable bytes per GPU after the headroom kept free (``None``: the measured margin; for a
    plan with optimizer offload, whose measured error is larger, the fixed 10%)."""
    capacity = int(profile.gpu_memory_gib * GIB)
    if headroom is None:
        return usable_device_bytes(capacity, runs_on_cpu(profile), offload=offload)
    return int(capacity * (1.0 - headroom))


def usable_device_bytes(capacity: int, on_cpu: bool = False, *, offload: bool = False) -> int:
    """A device's bytes less the memory model's measured error (constants.py): 1 GiB plus 1%
    on a GPU, or 10% where that is less; 10% on CPU ranks and under optimizer offload (the
    model's error there, 8.4%, is not smaller)."""
    fixed = FIXED_HEADROOM * capacity
    if on_cpu or offload:
        return int(capacity - fixed)
    return int(capacity - min(fixed, GPU_ERROR_BYTES + GPU_ERROR_SHARE * capacity))


def host_budget_bytes(profile: ClusterProfile, headroom: float | None = DEFAULT_HEADROOM) -> int:
    share = FIXED_HEADROOM if headroom is None else headroom
    return int(profile.cpu_memory_gib * GIB * (1.0 - share))
