"""The advisor's public data: one candidate configuration, the advice, and the no-fit error.

These shapes are a wire contract (``POST /v1/advice``, ``zeropilot advise --json``, the plan stored
on a job), so the field names and their meaning only ever grow, never change.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

GIB = 1024**3

OffloadDevice = Literal["none", "cpu"]


def format_bytes(nbytes: int) -> str:
    """GiB for real models, MiB below a GiB (the tiny example), two decimals."""
    if abs(nbytes) >= GIB:
        return f"{nbytes / GIB:.2f} GiB"
    return f"{nbytes / 1024**2:.2f} MiB"


Policy = Literal["throughput", "capacity"]
PeakPhase = Literal["initialize", "forward", "backward", "step"]
PHASE_WORDS: dict[str, str] = {
    "initialize": "inside deepspeed.initialize",
    "forward": "at the start of backward (activations)",
    "backward": "at the end of backward (gradients and buckets)",
    "step": "in the optimizer step",
}


class PerGpuBytes(BaseModel):
    """Predicted bytes on one GPU at the peak of a training step, by what holds them.

    ``total`` is the peak, not the plain sum: activations (forward/backward) and optimizer-step
    temporaries are never alive together, so the peak counts only the larger of the two.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    params: int
    gradients: int
    optimizer: int
    activations: int
    buffers: int
    temporaries: int
    overhead: int
    total: int


class Candidate(BaseModel):
    """One DeepSpeed configuration the advisor considered, with its predicted memory and cost."""

    model_config = ConfigDict(extra="forbid")

    zero_stage: int
    offload_optimizer: OffloadDevice
    offload_param: OffloadDevice
    activation_checkpointing: bool
    micro_batch_size: int
    gradient_accumulation_steps: int
    per_gpu_bytes: PerGpuBytes
    cpu_bytes_per_node: int
    fits: bool
    relative_cost: float
    ds_config: dict[str, Any]
    peak_phase: PeakPhase | None = None  # where in a step the peak is; absent in older plans
    # The step-time model's prediction (step_time.py); absent in older plans
    step_seconds: float | None = None  # one optimizer step (all micro-steps and the update)
    tokens_per_second: float | None = None  # the whole job's (every rank's) at that pace
    initialize_bytes: int | None = None  # the peak inside deepspeed.initialize, context included

    def label(self) -> str:
        """A short human name, e.g. ``ZeRO-2 +offload(opt) +ckpt mb=4``."""
        parts = [f"ZeRO-{self.zero_stage}"]
        if self.offload_param == "cpu":
            parts.append("+offload(opt+params)")
        elif self.offload_optimizer == "cpu":
            parts.append("+offload(opt)")
        if self.activation_checkpointing:
            parts.append("+ckpt")
        parts.append(f"mb={self.micro_batch_size}x{self.gradient_accumulation_steps}")
        return " ".join(parts)


class Advice(BaseModel):
    """The chosen plan, every candidate considered, and what the user should know."""

    model_config = ConfigDict(extra="forbid")

    plan: Candidate
    candidates: list[Candidate]
    warnings: list[str]
    reason: str


class BadOverrides(ValueError):
    """``zero.overrides`` that contradict the plan or break the batch identity: the user's
    field to fix, not the cluster's (a ValueError, so callers that caught that still do)."""


class ClusterTooSmall(ValueError):
    """The job asks for more nodes or GPUs per node than the cluster has."""


class NoPlanFits(Exception):
    """No candidate fits the memory budget; carries the closest one and the overshoot."""

    def __init__(
        self, closest: Candidate, over_by_bytes: int, budget_bytes: int, where: str = "per-GPU"
    ) -> None:
        self.closest = closest
        self.over_by_bytes = over_by_bytes
        self.budget_bytes = budget_bytes
        needs = closest.per_gpu_bytes.total if where == "per-GPU" else closest.cpu_bytes_per_node
        phase = closest.peak_phase
        at_peak = f" (peak {PHASE_WORDS[phase]})" if phase and where == "per-GPU" else ""
        super().__init__(
            f"no configuration fits the {where} budget of {format_bytes(budget_bytes)}; the "
            f"closest, {closest.label()}, needs {format_bytes(needs)}{at_peak}, "
            f"over by {format_bytes(over_by_bytes)} ({over_by_bytes} bytes)"
        )
