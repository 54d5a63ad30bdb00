"""The ``zeropilot`` command line: submit and watch jobs over HTTP, and run the service locally."""

from __future__ import annotations

import shlex
import sys
import time
import uuid
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from zeropilot.cli_advice import advise_command, lint_command
from zeropilot.cli_attempts import print_attempts
from zeropilot.cli_calibration import calibration_app
from zeropilot.cli_cancel import cancel_command
from zeropilot.cli_common import (
    JsonOpt,
    api_client,
    call_api,
    console,
    err,
    fail,
    inline_hf_config,
    print_json,
    read_mapping,
)
from zeropilot.cli_goodput import print_cadence, print_goodput, report_command
from zeropilot.cli_predicted import prediction_lines, start_cell
from zeropilot.cli_teams import teams_app
from zeropilot.client import Client, GaveUp

app = typer.Typer(help="Run DeepSpeed training jobs on shared GPU clusters.", no_args_is_help=True)
users_app = typer.Typer(
    help="Manage users (a service admin or team admin token needed).", no_args_is_help=True
)
app.add_typer(users_app, name="users")
app.add_typer(teams_app, name="teams")
app.add_typer(calibration_app, name="calibration")
app.command("advise")(advise_command)
app.command("lint")(lint_command)
app.command("cancel")(cancel_command)
app.command("report")(report_command)

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


class UserRole(StrEnum):  # service.core.roles.Role, spelled here to keep the client light
    member = "member"
    viewer = "viewer"
    team_admin = "team-admin"


HEARTBEAT_S = 20.0  # a silence this long prints what the job is doing; also a wait's longest hold


def load_spec(path: Path) -> dict[str, Any]:
    """Read a YAML/JSON job spec; relative paths in it are relative to the file's folder."""
    spec = read_mapping(path, "a job spec")
    base = path.resolve().parent
    inline_hf_config(spec, base)  # the server cannot read the user's config.json
    working_dir = Path(str(spec.get("working_dir") or "."))
    spec["working_dir"] = str(working_dir if working_dir.is_absolute() else base / working_dir)
    return spec


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="Job spec, YAML or JSON.")],
    wait: Annotated[bool, typer.Option("--wait", help="Follow the job until it ends.")] = False,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Retrying with the same key returns the same job.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit a training job. With --wait, exit 0 only if it SUCCEEDED."""
    client = api_client()
    spec = load_spec(file)
    key = idempotency_key or str(uuid.uuid4())  # one key for every try of this command
    job = _submit(client, spec, key, file)
    if not as_json:
        console.print(f"job [bold]{job['id']}[/bold] ({job['name']}) {job['status']}")
        _print_plan(job["plan"], job.get("advice_reason", ""))
    if wait:
        job = _follow(client, job["id"], quiet=as_json)
    if as_json:
        print_json(job)
    if wait and job["status"] != "SUCCEEDED":
        raise typer.Exit(1)


def _submit(client: Client, spec: dict[str, Any], key: str, file: Path) -> dict[str, Any]:
    """Send the job, trying again through an outage; on giving up, say how to get it safely."""
    try:
        job: dict[str, Any] = call_api(client.submit, spec, key, on_retry=_say_retrying)
    except GaveUp as exc:
        if not exc.maybe_stored:
            fail(f"{exc}; nothing was sent. Is `zeropilot up` running?")
        again = shlex.join(["zeropilot", "submit", str(file), "--idempotency-key", key])
        fail(f"{exc}. The job may have been stored: `{again}` returns it, never a second one.")
    return job


def _say_retrying(reason: str, delay: float, number: int, tries: int) -> None:
    err.print(f"{reason}, retrying in {delay:g} s ({number}/{tries})", highlight=False)


def _print_sharing(job: dict[str, Any]) -> None:
    """Borrowing and preemptions (docs/scheduling.md): absent from jobs that had neither."""
    if job.get("borrowing"):
        console.print("sharing: runs on GPUs lent past its team's quota", highlight=False)
    if preempted := job.get("preempted_by"):
        by = ", ".join(preempted)
        console.print(f"sharing: preempted {len(preempted)}x (by job {by})", highlight=False)


def _print_plan(plan: dict[str, Any], reason: str) -> None:
    offload = plan.get("offload_optimizer", "none")
    console.print(
        f"plan: ZeRO-{plan.get('zero_stage')} offload={offload} "
        f"checkpointing={'on' if plan.get('activation_checkpointing') else 'off'} "
        f"micro_batch={plan.get('micro_batch_size')} "
        f"accumulation={plan.get('gradient_accumulation_steps')}",
        highlight=False,
    )
    if reason:
        console.print(f"      {reason}", highlight=False)


def _follow(client: Client, job_id: str, quiet: bool) -> dict[str, Any]:
    """Print status changes and each new step until the job ends; return the final job.
    Between looks the server holds a long poll (``/wait``), answered as the job moves: the
    job is read again only on a new status or event, its metrics only on new points."""
    last_event, last_metric, last_heartbeat, last_wait = 0, 0, "", ""
    quiet_since = time.monotonic()
    job: dict[str, Any] = call_api(client.get_job, job_id)
    points: list[dict[str, Any]] = call_api(client.metrics, job_id, 0)
    while True:
        events = [e for e in job["events"] if e["id"] > last_event and e["subject"] == "job"]
        last_event = max((e["id"] for e in job["events"]), default=last_event)
        if points:
            last_metric, quiet_since = points[-1]["id"], time.monotonic()
        if not quiet:
            _print_in_order(events, points)
        if not quiet and job["status"] == "PENDING" and job["message"] != last_wait:
            last_wait = job["message"]  # why admission holds it (quota, cluster cap), once
            console.print(f"         ... {last_wait}", highlight=False)
        if job["status"] in TERMINAL:
            return job
        if not quiet and time.monotonic() - quiet_since > HEARTBEAT_S:
            last_heartbeat = _print_heartbeat(client, job, last_heartbeat)
            quiet_since = time.monotonic()
        progress = call_api(
            client.wait, job_id, job["status"], last_event, last_metric, HEARTBEAT_S
        )
        if progress["status"] != job["status"] or progress["last_event_id"] != last_event:
            job = call_api(client.get_job, job_id)
        moved = progress["last_metric_id"] != last_metric
        points = call_api(client.metrics, job_id, last_metric) if moved else []


def _print_in_order(events: list[dict[str, Any]], points: list[dict[str, Any]]) -> None:
    """One poll's job events and steps as they happened: the steps read after the job often
    came before its last event (the final steps, then SUCCEEDED)."""
    lines = [(e["created_at"], _event_line(e)) for e in events]
    lines += [(p["created_at"], _metric_line(p)) for p in points]
    for _when, line in sorted(lines, key=lambda item: datetime.fromisoformat(item[0])):
        # Reasons quote logs: "[enforce fail at ...]" is not markup.
        console.print(line, highlight=False, markup=False)


def _event_line(event: dict[str, Any]) -> str:
    return f"{event['created_at'][11:19]} {event['to_status']:<10} {event['reason']}"


def _print_heartbeat(client: Client, job: dict[str, Any], previous: str) -> str:
    """On a long silence, say what the job is doing: its pending reason or last log line."""
    attempt = job["attempts"][-1] if job["attempts"] else {}
    text, _ = call_api(client.logs, job["id"], 1)
    last_line = _clip(text.strip().splitlines()[-1]) if text.strip() else ""
    detail = attempt.get("failure_message") or last_line or "no output yet"
    line = f"         ... {job['status']}: {detail}"
    if line != previous:  # say it once; silence again means nothing new
        console.print(line, highlight=False)
    return line


def _clip(line: str, limit: int = 240) -> str:
    """A long log line shortened at a word, marked with an ellipsis, never cut mid-word."""
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0].rstrip(" ,;:") + " ..."


def _metric_line(point: dict[str, Any]) -> str:
    parts = [f"         step {point['step']:>5}"]
    if point.get("loss") is not None:
        parts.append(f"loss {point['loss']:.4f}")
    if point.get("tokens_per_s") is not None:
        parts.append(f"tokens/s {point['tokens_per_s']:,.0f}")
    return "  ".join(parts)


@app.command("list")
def list_jobs(
    status: Annotated[str | None, typer.Option(help="Only jobs in this status.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """Your team's jobs, newest first."""
    page = call_api(api_client().list_jobs, status.upper() if status else None, limit)
    if as_json:
        print_json(page)
        return
    table = Table(
        "ID", "NAME", "STATUS", "ATTEMPT", "PREEMPTED", "CLUSTER", "CREATED", "PREDICTED START",
        box=None,
    )  # fmt: skip
    for job in page["data"]:
        preempted = len(job.get("preempted_by", []))
        table.add_row(
            job["id"],
            job["name"],
            job["status"],
            str(job["current_attempt"]),
            f"{preempted}x" if preempted else "-",
            job["cluster"] + (" (borrowing)" if job.get("borrowing") else ""),
            job["created_at"][:19].replace("T", " "),
            start_cell(job),
        )
    console.print(table)
    console.print(f"{len(page['data'])} of {page['count']} jobs", highlight=False)


@app.command()
def status(job_id: str, as_json: JsonOpt = False) -> None:
    """One job: its plan, attempts, recent events, last metrics and checkpoints."""
    job = call_api(api_client().get_job, job_id)
    if as_json:
        print_json(job)
        return
    console.print(f"job [bold]{job['id']}[/bold] {job['name']} ({job['team']}): {job['status']}")
    if job["failure_class"]:
        message = job["message"]  # it names the class first; older jobs' may not
        if not message.startswith(job["failure_class"]):
            message = f"{job['failure_class']}: {message}"
        failure = f"failure: {message}"
        console.print(failure, highlight=False, markup=False)
    elif job["status"] == "PENDING" and job["message"]:
        console.print(job["message"], highlight=False)  # why admission holds it
    for line in prediction_lines(job):
        console.print(line, highlight=False, markup=False)
    _print_plan(job["plan"], job["advice_reason"])
    _print_sharing(job)
    print_attempts(job)
    for event in job["events"][-8:]:
        stamp = event["created_at"][:19].replace("T", " ")
        console.print(
            f"  {stamp} {event['subject']:<7} {event['to_status']:<10} {event['reason']}",
            highlight=False,
            markup=False,
        )
    if job["metrics"]:
        console.print("last step:" + _metric_line(job["metrics"][-1]).strip().removeprefix("step"))
    if job["checkpoints"]:
        print_checkpoints(job)
    print_cadence(job)
    print_goodput(job)


def print_checkpoints(job: dict[str, Any]) -> None:
    """The checkpoints kept on disk, their bytes, and the ones retention deleted."""
    rows = job["checkpoints"]
    kept = [c for c in rows if not c.get("deleted_at")]
    deleted = len(rows) - len(kept)
    total = _mib(job.get("checkpoint_bytes", 0))
    console.print(f"checkpoints: {len(kept)} kept ({total}), {deleted} deleted", highlight=False)
    for checkpoint in kept:
        state = {True: "complete", False: "incomplete", None: "not checked yet"}
        size = _mib(checkpoint["size_bytes"]) if checkpoint.get("size_bytes") else "?"
        line = f"  step {checkpoint['step']:>6}  {size:>10}  {state[checkpoint.get('complete')]}"
        console.print(f"{line}  {checkpoint['path']}", highlight=False, markup=False)


def _mib(nbytes: int) -> str:
    return f"{nbytes / 1024**2:.2f} MiB"


@app.command()
def logs(
    job_id: str,
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Keep printing new lines.")
    ] = False,
    tail: Annotated[int, typer.Option(min=1, max=10000)] = 200,
    attempt: Annotated[int | None, typer.Option(help="Attempt number (default: current).")] = None,
) -> None:
    """The log of a job's attempt."""
    client = api_client()
    text, offset = call_api(client.logs, job_id, tail, None, attempt)
    sys.stdout.write(text)
    if not follow:
        return
    offset = offset or 0
    while True:
        chunk, next_offset = call_api(client.logs, job_id, tail, offset, attempt)
        sys.stdout.write(chunk)
        sys.stdout.flush()
        offset = next_offset if next_offset is not None else offset
        if not chunk and call_api(client.get_job, job_id)["status"] in TERMINAL:
            return
        time.sleep(1.0)


@app.command()
def metrics(job_id: str, as_json: JsonOpt = False) -> None:
    """Every metric point a job's training reported."""
    client = api_client()
    points = call_api(client.metrics, job_id)
    if as_json:
        print_json(points)
        return
    # Numbered as `status` numbers them ("attempt 1"), not by the attempts' ids.
    numbers = {a["id"]: str(a["number"]) for a in call_api(client.get_job, job_id)["attempts"]}
    table = Table("STEP", "LOSS", "TOKENS/S", "ATTEMPT", box=None)
    for p in points:
        loss = f"{p['loss']:.4f}" if p["loss"] is not None else "-"
        rate = f"{p['tokens_per_s']:,.0f}" if p["tokens_per_s"] is not None else "-"
        table.add_row(str(p["step"]), loss, rate, numbers.get(p["attempt_id"], p["attempt_id"]))
    console.print(table)


@users_app.command("create")
def create_user(
    name: str,
    team: Annotated[str, typer.Option(help="The user's team (created if new).")],
    admin: Annotated[bool, typer.Option("--admin", help="A service admin (all teams).")] = False,
    role: Annotated[
        UserRole, typer.Option(help="In the team: member, viewer (read-only) or team-admin.")
    ] = UserRole.member,
    as_json: JsonOpt = False,
) -> None:
    """Create a user (service admins: in any team; team admins: in their own); its token is
    printed once."""
    user = call_api(api_client().create_user, name, team, admin, role.value)
    if as_json:
        print_json(user)
    else:
        console.print(
            f"user {user['name']} ({user['role']}) in team {user['team']}; token (shown once):"
        )
        console.print(user["token"], highlight=False)


@app.command()
def up(
    host: Annotated[str | None, typer.Option(help="API address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="API port (default 8321).")] = None,
) -> None:
    """Run the API, a worker and the reconcile scheduler here, on the embedded defaults."""
    from zeropilot.up import run_embedded  # the service's imports stay out of the client's path

    run_embedded(host, port)


@app.command()
def migrate() -> None:
    """Bring the database to the latest schema; on an empty one, create the first admin."""
    from service.db.migrate import upgrade
    from service.db.session import session_scope
    from service.db.users import bootstrap_admin
    from service.settings import get_settings

    settings = get_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.database_url)
    console.print("database at the latest migration")
    with session_scope(settings.database_url) as session:
        token = bootstrap_admin(session)
    if token:
        console.print("created user admin in team default; token (shown once):")
        console.print(token, highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
