"""``zeropilot teams``: GPU quotas and fair-share weights per team, and what each holds now."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from zeropilot.cli_common import JsonOpt, api_client, call_api, console, fail, print_json

teams_app = typer.Typer(
    help="Team GPU quotas and fair-share weights (changing them needs an admin token).",
    no_args_is_help=True,
)


@teams_app.command("list")
def list_teams(as_json: JsonOpt = False) -> None:
    """Every team (yours only, unless you are an admin): quota, share, GPUs held, jobs waiting."""
    teams = call_api(api_client().teams)
    if as_json:
        print_json(teams)
        return
    table = Table(
        "team", "GPU quota", "share", "GPUs held", "borrowed", "lent", "borrow limit",
        "jobs waiting",
    )  # fmt: skip
    for team in teams:
        table.add_row(
            team["name"], _or_none(team["gpu_quota"]), str(team["gpu_share"]),
            str(team["gpus_held"]), str(team["gpus_borrowed"]), str(team["gpus_lent"]),
            _or_none(team["gpu_borrow_limit"]), str(team["jobs_waiting"]),
        )  # fmt: skip
    console.print(table)


@teams_app.command("set")
def set_team(
    name: str,
    gpu_quota: Annotated[
        int | None, typer.Option(help="GPUs the team's admitted jobs may hold at once.", min=1)
    ] = None,
    no_gpu_quota: Annotated[bool, typer.Option("--no-gpu-quota", help="Remove the quota.")] = False,
    borrow_limit: Annotated[
        int | None,
        typer.Option(
            help="With borrowing on: GPUs past its quota the team may borrow (0: never).", min=0
        ),
    ] = None,
    no_borrow_limit: Annotated[
        bool, typer.Option("--no-borrow-limit", help="Let the team borrow any idle GPUs.")
    ] = False,
    share: Annotated[
        int | None, typer.Option(help="Fair-share weight (1-1000; default 1).", min=1, max=1000)
    ] = None,
    checkpoint_root: Annotated[
        list[str] | None,
        typer.Option(
            help="A folder where the team's jobs may put their own checkpoint.dir (repeat for"
            " more; replaces the team's list).",
        ),
    ] = None,
    no_checkpoint_roots: Annotated[
        bool, typer.Option("--no-checkpoint-roots", help="Remove every checkpoint root.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Change a team's quota, borrow limit, share or checkpoint roots; waiting jobs that now
    fit start."""
    fields: dict[str, Any] = {}
    if gpu_quota is not None and no_gpu_quota:
        fail("give --gpu-quota N or --no-gpu-quota, not both", 2)
    if gpu_quota is not None or no_gpu_quota:
        fields["gpu_quota"] = gpu_quota
    if borrow_limit is not None and no_borrow_limit:
        fail("give --borrow-limit N or --no-borrow-limit, not both", 2)
    if borrow_limit is not None or no_borrow_limit:
        fields["gpu_borrow_limit"] = borrow_limit
    if share is not None:
        fields["gpu_share"] = share
    if checkpoint_root and no_checkpoint_roots:
        fail("give --checkpoint-root PATH or --no-checkpoint-roots, not both", 2)
    if checkpoint_root or no_checkpoint_roots:
        fields["checkpoint_roots"] = checkpoint_root or []
    if not fields:
        fail(
            "nothing to change: give --gpu-quota, --no-gpu-quota, --borrow-limit,"
            " --no-borrow-limit, --share, --checkpoint-root or --no-checkpoint-roots",
            2,
        )
    team = call_api(api_client().update_team, name, **fields)
    if as_json:
        print_json(team)
        return
    quota = "no quota" if team["gpu_quota"] is None else f"quota {team['gpu_quota']} GPUs"
    roots = ", ".join(team["checkpoint_roots"]) or "none"
    limit = _or_none(team["gpu_borrow_limit"])
    console.print(
        f"team {team['name']}: {quota}, borrow limit {limit}, share {team['gpu_share']},"
        f" checkpoint roots {roots}; holds {team['gpus_held']} GPUs (borrowed"
        f" {team['gpus_borrowed']}, lent {team['gpus_lent']}), {team['jobs_waiting']} job(s)"
        " waiting",
        highlight=False,
    )


def _or_none(gpus: int | None) -> str:
    return "none" if gpus is None else str(gpus)
