"""Model FLOPs utilisation: the share of its GPUs' peak that a job's model arithmetic uses.

The FLOPs per token are the advisor's (``Workload.forward_flops_per_token``), three forward
passes' worth for a forward and a backward; recomputation under activation checkpointing is
left out, as MFU conventionally does. The peak is the profile's ``peak_tflops``, else the
accelerator's spec sheet (hardware.py): dense 16-bit, whatever precision the job trains in.
"""

from __future__ import annotations

from service.core.advisor.models import ClusterTooSmall
from service.core.advisor.workload import build_workload
from service.core.clusters import ClusterProfile
from service.core.spec import JobSpec


def job_mfu(spec: JobSpec, profile: ClusterProfile, tokens_per_s: float | None) -> float | None:
    """The job's MFU at ``tokens_per_s`` (the whole job's); None without a pace, or when the
    job no longer fits the profile (a profile changed since it ran)."""
    if not tokens_per_s:
        return None
    try:
        work = build_workload(spec, profile)
    except (ClusterTooSmall, ValueError):
        return None
    whole, _blocks = work.forward_flops_per_token
    return tokens_per_s * 3.0 * whole / (work.world_size * work.hardware.peak_flops)
