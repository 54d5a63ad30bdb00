"""``zeropilot cancel``: stop a job gracefully (SIGTERM, a save, SIGKILL after the grace), and
with ``--checkpoint`` wait for the stop and say which checkpoint it saved."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from zeropilot.cli_common import JsonOpt, api_client, call_api, console, err, print_json
from zeropilot.client import Client

ENDED = {"SUCCEEDED", "FAILED", "CANCELLED", "PREEMPTED", "LOST"}  # an attempt's end
# How long past the grace the wait goes on: a reconcile pass or two, and the ranks' exit.
MARGIN_S = 120.0
DEFAULT_GRACE_S = 30.0  # the service's default, until the worker says which grace it chose


def cancel_command(
    job_id: str,
    checkpoint: Annotated[
        bool,
        typer.Option(
            "--checkpoint",
            help="Wait until the training has saved and stopped, and name the checkpoint (exit"
            " 1 when it stopped without saving).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a job: its training gets SIGTERM and its grace to save, then its processes stop."""
    client = api_client()
    job = call_api(client.cancel, job_id)
    if checkpoint and job["current_attempt"]:
        job, saved = _wait_for_the_stop(client, job)
    else:
        saved = None
    if as_json:
        print_json(job)
    else:
        console.print(f"job {job['id']} {job['status']}", highlight=False)
    if checkpoint and not as_json:
        console.print(_what_was_saved(job, saved), highlight=False, markup=False)
    if saved is False:
        raise typer.Exit(1)


def _wait_for_the_stop(client: Client, job: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Poll until the stopped attempt has ended; whether its training saved at the stop."""
    number = job["current_attempt"]
    said = False
    started = time.monotonic()
    while True:
        job = call_api(client.get_job, job["id"])
        attempt = _attempt(job, number)
        if attempt is None or attempt["status"] in ENDED:
            break
        grace = attempt.get("stop_grace_s")
        if grace is not None and not said:
            why = attempt.get("stop_grace") or f"{grace} s"
            err.print(f"waiting for attempt {number} to save and stop (grace {why})")
            said = True
        if time.monotonic() - started > (grace or DEFAULT_GRACE_S) + MARGIN_S:
            err.print(f"attempt {number} has not stopped yet; `zeropilot status {job['id']}`")
            return job, False
        time.sleep(1.0)
    stopped = _attempt(job, number)
    if stopped is None or not stopped["backend_ref"]:
        return job, True  # it never ran: nothing was lost
    # PREEMPTED: the training said it saved at the stop; SUCCEEDED: it had finished already
    return job, stopped["runtime_failure_tag"] == "PREEMPTED" or stopped["status"] == "SUCCEEDED"


def _what_was_saved(job: dict[str, Any], saved: bool | None) -> str:
    number = job["current_attempt"]
    attempt = _attempt(job, number)
    if attempt is None or not attempt["backend_ref"]:
        return "it never ran: nothing to save"
    own = [c for c in job["checkpoints"] if c["attempt_id"] == attempt["id"]]
    latest = max(job["checkpoints"], key=lambda c: c["step"], default=None)
    if saved and own and attempt["status"] != "SUCCEEDED":
        last = max(own, key=lambda c: c["step"])
        return f"attempt {number} saved step {last['step']} before it stopped: {last['path']}"
    if attempt["status"] == "SUCCEEDED":
        where = f"step {latest['step']}: {latest['path']}" if latest else "none reported"
        return f"attempt {number} had finished before the cancel; its last checkpoint is {where}"
    last = f"step {latest['step']}: {latest['path']}" if latest else "none"
    return (
        f"attempt {number} stopped without saving (its training ignores SIGTERM, or did not"
        f" save within its grace); the last checkpoint is {last}"
    )


def _attempt(job: dict[str, Any], number: int) -> dict[str, Any] | None:
    return next((a for a in job["attempts"] if a["number"] == number), None)
