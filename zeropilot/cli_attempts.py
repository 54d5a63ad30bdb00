"""``zeropilot status``'s attempt lines: how each attempt ended, and each re-plan, old -> new.

An escalation is told from the job's ``ESCALATING`` events (one per re-plan, in order) and the
attempts' plans; the numbers come from the attempt's ``failure_evidence``. Plain dicts from the
API only: the client never imports the service.
"""

from __future__ import annotations

from typing import Any

from zeropilot.cli_common import console

# Evidence figures worth a user's eye, in the order they read best.
_FIGURES = (
    ("tried_bytes", "tried"),
    ("missing_bytes", "missing"),
    ("free_bytes", "free"),
    ("capacity_bytes", "device total"),
    ("process_bytes", "this process"),
    ("other_processes_bytes", "other processes"),
    ("in_use_bytes", "address space in use"),
    ("limit_bytes", "limit"),
    ("rss_bytes", "resident"),
)


def plan_label(plan: dict[str, Any]) -> str:
    """The advisor's short name of a plan, e.g. ``ZeRO-0 +ckpt mb=4x2``."""
    parts = [f"ZeRO-{plan.get('zero_stage')}"]
    if plan.get("offload_param") == "cpu":
        parts.append("+offload(opt+params)")
    elif plan.get("offload_optimizer") == "cpu":
        parts.append("+offload(opt)")
    if plan.get("activation_checkpointing"):
        parts.append("+ckpt")
    parts.append(f"mb={plan.get('micro_batch_size')}x{plan.get('gradient_accumulation_steps')}")
    return " ".join(parts)


def format_bytes(nbytes: int) -> str:
    if abs(nbytes) >= 1024**3:
        return f"{nbytes / 1024**3:.2f} GiB"
    return f"{nbytes / 1024**2:.2f} MiB"


def evidence_line(evidence: dict[str, Any]) -> str:
    numbers = {**evidence.get("numbers", {}), "missing_bytes": evidence.get("missing_bytes")}
    shown = [f"{name} {format_bytes(numbers[key])}" for key, name in _FIGURES if numbers.get(key)]
    return ", ".join(shown)


def print_attempts(job: dict[str, Any]) -> None:
    """Each attempt: status, how it ended and its evidence; each re-plan: old -> new, and why."""
    # Each re-plan's event names the evidence, old plan -> new plan, and the predicted saving.
    replans = [e["reason"] for e in job["events"] if e["to_status"] == "ESCALATING"]
    for attempt in job["attempts"]:
        if attempt["number"] > 1 and replans:
            console.print(f"  re-planned: {replans.pop(0)}", highlight=False, markup=False)
        line = f"attempt {attempt['number']}: {attempt['status']} {plan_label(attempt['plan'])}"
        console.print(f"{line} ({attempt['rung']})", highlight=False, markup=False)
        if attempt["failure_class"]:
            console.print(f"  ended: {attempt['failure_message']}", highlight=False, markup=False)
            if figures := evidence_line(attempt.get("failure_evidence") or {}):
                console.print(f"  evidence: {figures}", highlight=False, markup=False)
