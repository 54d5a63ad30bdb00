"""``zeropilot status``'s GPU time lines and ``zeropilot report``: where GPU time went.

Plain dicts from the API (``goodput`` in a job's detail, a team's report): the client never
imports the service. docs/goodput.md defines the causes.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from zeropilot.cli_common import JsonOpt, api_client, call_api, console, print_json

CAUSE_WORDS = {
    "startup": "startup",
    "checkpointing": "saves",
    "redone": "redone",
    "hang": "hang",
    "stop_save": "saving at a stop",
    "ending": "ending",
}


def _lost_words(lost: dict[str, float], held: float) -> str:
    shown = [(CAUSE_WORDS.get(c, c), s) for c, s in lost.items() if s > 0]
    return ", ".join(f"{name} {100 * s / held:.1f}%" for name, s in shown) or "none"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.3f}" if seconds < 36_000 else f"{seconds / 3600:,.0f}"


def print_goodput(job: dict[str, Any]) -> None:
    """One line for the job, one per attempt that held GPUs, and its MFU."""
    goodput = job.get("goodput")
    if not goodput or goodput["gpu_seconds"] <= 0:
        return
    held = goodput["gpu_seconds"]
    console.print(
        f"GPU time: {_hours(held)} GPU-h held, {100 * goodput['goodput']:.1f}% productive; "
        f"lost: {_lost_words(goodput['lost_gpu_seconds'], held)}",
        highlight=False,
        markup=False,
    )
    for attempt in goodput["attempts"]:
        seconds, kept = attempt["gpu_seconds"], attempt["productive_gpu_seconds"]
        lost = _lost_words(attempt["lost_gpu_seconds"], seconds)
        line = f"  attempt {attempt['number']}: {seconds:,.0f} GPU-s, {kept:,.0f} productive"
        console.print(f"{line}; lost: {lost}", highlight=False, markup=False)
    if goodput.get("mfu") is not None:
        rate = goodput["tokens_per_s"]
        console.print(f"MFU: {100 * goodput['mfu']:.2f}% at {rate:,.0f} tokens/s", highlight=False)


def print_cadence(job: dict[str, Any]) -> None:
    """The interval the current attempt saves at, and why (service.db.cadence keeps it)."""
    current = [a for a in job["attempts"] if a["number"] == job["current_attempt"]]
    evidence = current[0].get("runtime_evidence") or {} if current else {}
    if chosen := evidence.get("checkpoint_interval"):
        console.print(f"checkpoints {chosen['reason']}", highlight=False, markup=False)


def report_command(
    team: Annotated[str, typer.Option(help="The team (yours; any for admins).")],
    since: Annotated[str, typer.Option(help="7d, 12h, 30m back, or an ISO 8601 time.")] = "7d",
    as_json: JsonOpt = False,
) -> None:
    """A team's GPU time since then: used, productive, lost by cause, goodput and cost."""
    shown = call_api(api_client().team_report, team, since)
    if as_json:
        print_json(shown)
        return
    held = shown["gpu_hours"]
    console.print(
        f"team {shown['team']} from {shown['since'][:19]} to {shown['until'][:19]} UTC: "
        f"{shown['jobs']} jobs, {held:,.3f} GPU-hours",
        highlight=False,
    )
    if held <= 0:
        return
    console.print(
        f"productive {shown['productive_gpu_hours']:,.3f} GPU-h ({100 * shown['goodput']:.1f}%)",
        highlight=False,
    )
    for cause, hours in shown["lost_gpu_hours"].items():
        if hours > 0:
            name = CAUSE_WORDS.get(cause, cause)
            console.print(f"  lost to {name}: {hours:,.3f} GPU-h", highlight=False, markup=False)
    if shown["cost_usd"] is not None:
        console.print(
            f"cost ${shown['cost_usd']:,.2f}, of which lost ${shown['lost_cost_usd']:,.2f}",
            highlight=False,
            markup=False,
        )
    if shown["unpriced_gpu_hours"] > 0:
        console.print(f"{shown['unpriced_gpu_hours']:,.3f} GPU-h on clusters with no price")
