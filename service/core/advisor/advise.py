"""``advise``: every candidate for a job on a cluster, the chosen plan, warnings and the reason.

Pinned fields narrow the candidates. When nothing pinned fits but an unpinned plan would, the
pins are honoured anyway (the user asked for them) and a warning names the predicted overshoot
and the plan the advisor would have chosen. When nothing fits at all, NoPlanFits names the
closest candidate and how far over budget it is.
"""

from __future__ import annotations

from service.core.advisor.calibration import ClusterCalibration
from service.core.advisor.candidates import Budgets, enumerate_layouts, evaluate_layout
from service.core.advisor.choice import capacity_key, choose, explain
from service.core.advisor.constants import CALIBRATION, DEFAULT_HEADROOM, Calibration
from service.core.advisor.layout import Workload
from service.core.advisor.models import Advice, Candidate, NoPlanFits, Policy, format_bytes
from service.core.advisor.workload import budget_bytes, build_workload, host_budget_bytes
from service.core.clusters import ClusterProfile
from service.core.spec import JobSpec, Offload

POLICIES = ("throughput", "capacity")


def advise(
    spec: JobSpec,
    profile: ClusterProfile,
    policy: Policy = "throughput",
    *,
    headroom: float | None = DEFAULT_HEADROOM,
    calibration: ClusterCalibration | None = None,
) -> Advice:
    """Predict memory for every candidate configuration and pick the plan under ``policy``,
    with the cluster's ``calibration`` when given (and the reason then says how calibrated)."""
    advice = _advise(spec, profile, policy, headroom, calibration)
    if calibration is None:
        return advice
    reason = f"{advice.reason} {calibration.explain(advice.plan.step_seconds)}"
    return advice.model_copy(update={"reason": reason})


def _advise(
    spec: JobSpec,
    profile: ClusterProfile,
    policy: Policy,
    headroom: float | None,
    calibration: ClusterCalibration | None,
) -> Advice:
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, not {policy!r}")
    if headroom is not None and not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom must be in [0, 1), not {headroom}")
    work = build_workload(spec, profile)
    budgets = Budgets(
        budget_bytes(profile, headroom),
        host_budget_bytes(profile, headroom),
        budget_bytes(profile, headroom, offload=True),
    )
    constants = calibration.constants if calibration is not None else CALIBRATION
    candidates = evaluate_all(spec, work, budgets, constants)
    if not candidates:
        raise ValueError(
            "the pinned zero.stage and zero.offload leave no configuration to consider"
        )
    warnings = general_warnings(spec, work)
    fitting = [c for c in candidates if c.fits]
    if fitting:
        plan = choose(fitting, policy)
        return Advice(
            plan=plan,
            candidates=candidates,
            warnings=warnings,
            reason=explain(plan, candidates, policy, budgets.per_gpu),
        )
    return _advice_for_pins_that_do_not_fit(
        spec, work, budgets, candidates, warnings, policy, constants
    )


def evaluate_all(
    spec: JobSpec, work: Workload, budgets: Budgets, constants: Calibration = CALIBRATION
) -> list[Candidate]:
    return [
        evaluate_layout(spec, work, layout, budgets, constants)
        for layout in enumerate_layouts(spec, work)
    ]


def _advice_for_pins_that_do_not_fit(
    spec: JobSpec,
    work: Workload,
    budgets: Budgets,
    candidates: list[Candidate],
    warnings: list[str],
    policy: Policy,
    constants: Calibration,
) -> Advice:
    unpinned_spec = without_pins(spec)
    unpinned = (
        evaluate_all(unpinned_spec, work, budgets, constants)
        if unpinned_spec != spec
        else candidates
    )
    alternatives = [c for c in unpinned if c.fits]
    if not alternatives:
        raise no_plan_fits(unpinned, budgets)
    closest = min(candidates, key=capacity_key)
    better = choose(alternatives, policy)
    warnings.append(
        f"the pinned settings ({pinned_summary(spec)}) do not fit: the closest, {closest.label()}, "
        f"needs {format_bytes(closest.per_gpu_bytes.total)} per GPU of "
        f"{format_bytes(budgets.per_gpu)} usable; unpinned, the advisor would choose "
        f"{better.label()} ({format_bytes(better.per_gpu_bytes.total)})"
    )
    reason = (
        f"The pinned settings are honoured although no pinned configuration is predicted to fit; "
        f"{closest.label()} needs the least memory among them."
    )
    return Advice(plan=closest, candidates=candidates, warnings=warnings, reason=reason)


def without_pins(spec: JobSpec) -> JobSpec:
    """The same job with stage, offload, checkpointing and micro-batch left to the advisor."""
    zero = spec.zero.model_copy(
        update={"stage": "auto", "offload": Offload.AUTO, "activation_checkpointing": "auto"}
    )
    training = spec.training.model_copy(
        update={"micro_batch_size": "auto", "gradient_accumulation_steps": None}
    )
    return spec.model_copy(update={"zero": zero, "training": training})


def pinned_summary(spec: JobSpec) -> str:
    pins = []
    if spec.zero.stage != "auto":
        pins.append(f"zero.stage={spec.zero.stage}")
    if spec.zero.offload != Offload.AUTO:
        pins.append(f"zero.offload={spec.zero.offload.value}")
    if spec.zero.activation_checkpointing != "auto":
        pins.append(f"zero.activation_checkpointing={spec.zero.activation_checkpointing}")
    if spec.training.micro_batch_size != "auto":
        pins.append(f"training.micro_batch_size={spec.training.micro_batch_size}")
    if spec.training.gradient_accumulation_steps is not None:
        pins.append(
            f"training.gradient_accumulation_steps={spec.training.gradient_accumulation_steps}"
        )
    return ", ".join(pins) or "none"


def no_plan_fits(candidates: list[Candidate], budgets: Budgets) -> NoPlanFits:
    """The error for a job nothing fits: the candidate closest to its budgets, and by how much."""

    def overshoots(c: Candidate) -> tuple[int, int]:
        gpu = c.per_gpu_bytes.total - budgets.per_gpu
        return (max(gpu, c.cpu_bytes_per_node - budgets.host_per_node), gpu)

    closest = min(candidates, key=overshoots)
    worst, gpu = overshoots(closest)
    if gpu == worst:
        return NoPlanFits(closest, gpu, budgets.per_gpu)
    return NoPlanFits(closest, worst, budgets.host_per_node, "host per-node")


def general_warnings(spec: JobSpec, work: Workload) -> list[str]:
    warnings = []
    if work.shape.inferred:
        shape = work.shape
        warnings.append(
            f"model shape inferred from the parameter count: hidden {shape.hidden}, "
            f"{shape.layers} layers, {shape.heads} heads, vocabulary {shape.vocab}; give the "
            "shape or model.hf_config for better activation estimates"
        )
    if work.on_cpu and spec.zero.offload in (Offload.OPTIMIZER, Offload.ALL):
        warnings.append(
            "ranks run on the CPU here, so offload moves state within the same memory "
            "and saves nothing"
        )
    return warnings
