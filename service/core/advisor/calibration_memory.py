"""The memory side of learning from a cluster, under one rule: never an unsafe fit from one run.

What a step allocates and frees (activations, gradient copies, the update's scratch) is where the
model's fitted terms live; what every step holds (parameters, fp32 master, optimizer states) is
counted from the code. So the correction is one share added to the allocator's share of those
bytes (``Overhead.gpu_reserved_per_transient`` on a GPU, ``cpu_fragmentation`` on CPU ranks).
An observation needs a share when its real need exceeds the prediction plus what the headroom
keeps for the model's error on the smallest device the plan fits (1 GiB + 1% on a GPU, 10%
under optimizer offload and on CPU ranks): there the advisor would have said "fits" wrongly.
The share rises at once to cover the worst such run, up to ``MOST_RAISED``. It falls only when
at least ``FEWEST_TO_LOWER`` exact peaks all had room to spare, and then by half the room of
the tightest of them (the other half is for plans not seen yet), never below ``MOST_LOWERED``.
An allocated peak (what the runtime reports on a GPU today) is a lower bound of the reserved
one: it can raise the share, never lower it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from service.core.advisor.constants import (
    FIXED_HEADROOM,
    GPU_ERROR_BYTES,
    GPU_ERROR_SHARE,
    Calibration,
)
from service.core.advisor.layout import Layout, Workload
from service.core.advisor.memory import predict_memory

PeakKind = Literal["reserved", "allocated", "resident"]
MOST_RAISED = 1.0  # the step's transient bytes doubled: past that the model, not a share, is wrong
MOST_LOWERED = -0.05  # a twentieth of the transient bytes: the headroom stays for unseen shapes
FEWEST_TO_LOWER = 10  # exact peaks that must all have room before predictions go down


class PeakRun(Protocol):
    """What the memory rule reads of an observation."""

    @property
    def key(self) -> str: ...
    @property
    def work(self) -> Workload: ...
    @property
    def layout(self) -> Layout: ...
    @property
    def peak_bytes(self) -> int | None: ...
    @property
    def peak_kind(self) -> PeakKind: ...


@dataclass(frozen=True)
class Need:
    """The share one observation asks for: positive when its peak would not have fitted."""

    observation: str
    share: float
    exact: bool  # a reserved or resident peak; an allocated one only bounds the need below


@dataclass(frozen=True)
class MemoryCorrection:
    gpu_share: float = 0.0  # added to Overhead.gpu_reserved_per_transient
    cpu_share: float = 0.0  # added to Overhead.cpu_fragmentation
    needs: tuple[Need, ...] = ()
    reason: str = "no measured peaks: the model's own terms"


def with_share(constants: Calibration, on_cpu: bool, share: float) -> Calibration:
    overhead = constants.overhead
    if on_cpu:
        overhead = replace(overhead, cpu_fragmentation=overhead.cpu_fragmentation + share)
    else:
        extra = overhead.gpu_reserved_per_transient + share
        overhead = replace(overhead, gpu_reserved_per_transient=extra)
    return replace(constants, overhead=overhead)


def needed_bytes(run: PeakRun, constants: Calibration) -> int:
    """What the device must hold: torch's counters leave out the CUDA context; RSS does not."""
    assert run.peak_bytes is not None
    if run.peak_kind == "resident":
        return run.peak_bytes
    return run.peak_bytes + constants.overhead.gpu_context_bytes


def allowance(total: int, run: PeakRun) -> float:
    """What the headroom keeps free for the model's error at the smallest device this plan fits:
    1 GiB + 1% on a GPU, 10% under optimizer offload and on CPU ranks (constants.py)."""
    if run.work.on_cpu or run.layout.offload_optimizer:
        return total * FIXED_HEADROOM / (1 - FIXED_HEADROOM)
    capacity = (total + GPU_ERROR_BYTES) / (1 - GPU_ERROR_SHARE)
    return capacity - total


def covered_bytes(run: PeakRun, constants: Calibration) -> float:
    """The most a run may need and still fit the smallest budget the advisor calls enough."""
    total = predict_memory(run.work, run.layout, constants).per_gpu.total
    return total + allowance(total, run)


def need_of(run: PeakRun, constants: Calibration) -> Need | None:
    """The share that would have let this run's peak fit its smallest budget (the allowance
    grows with the prediction, so per share is measured on both); None when the share cannot
    reach its peak (the peak is inside deepspeed.initialize)."""
    covered = covered_bytes(run, constants)
    per_share = covered_bytes(run, with_share(constants, run.work.on_cpu, 1.0)) - covered
    if per_share <= 0:
        return None
    short = needed_bytes(run, constants) - covered
    return Need(run.key, short / per_share, run.peak_kind != "allocated")


def safe_share(needs: Sequence[Need]) -> tuple[float, str]:
    """The rule: up at once to the worst need, down only on many exact peaks with room."""
    if not needs:
        return 0.0, "no measured peaks"
    worst = max(needs, key=lambda n: n.share)
    if worst.share > 0:
        share = min(math.ceil(worst.share * 1000) / 1000, MOST_RAISED)  # whole bytes round
        capped = " (capped: the model is wrong for that plan)" if worst.share > share else ""
        return share, f"raised by {share:+.3f} for {worst.observation}{capped}"
    exact = sum(n.exact for n in needs)
    if exact < FEWEST_TO_LOWER:
        return 0.0, f"unchanged: {exact} exact peaks with room, {FEWEST_TO_LOWER} would lower it"
    share = max(worst.share / 2, MOST_LOWERED)  # half the tightest room stays for unseen plans
    return share, f"lowered by {share:+.3f} on {exact} exact peaks, tightest {worst.observation}"


def correct_memory(runs: Sequence[PeakRun], constants: Calibration) -> MemoryCorrection:
    measured = [r for r in runs if r.peak_bytes is not None]
    shares, reasons, needs = {}, [], []
    for on_cpu in (False, True):
        found = [n for r in measured if r.work.on_cpu == on_cpu if (n := need_of(r, constants))]
        if found:
            shares[on_cpu], reason = safe_share(found)
            reasons.append(f"{'CPU ranks' if on_cpu else 'GPU'}: {reason}")
            needs += found
    if not reasons:
        return MemoryCorrection()
    return MemoryCorrection(
        gpu_share=shares.get(False, 0.0),
        cpu_share=shares.get(True, 0.0),
        needs=tuple(needs),
        reason="; ".join(reasons),
    )
