"""``zeropilot calibration``: what the advisor learnt on a cluster, and freezing or resetting it
(those need an admin token)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from zeropilot.cli_common import JsonOpt, api_client, call_api, console, fail, print_json

calibration_app = typer.Typer(
    help="The advisor's calibration per cluster, learnt from finished attempts.",
    no_args_is_help=True,
)


@calibration_app.command("show")
def show(cluster: str, as_json: JsonOpt = False) -> None:
    """The fitted constants, how many runs they rest on, and the latest observations."""
    _print(call_api(api_client().calibration, cluster), as_json, observations=True)


@calibration_app.command("freeze")
def freeze(cluster: str, as_json: JsonOpt = False) -> None:
    """Keep the constants as they are; finished attempts are still recorded."""
    _print(call_api(api_client().freeze_calibration, cluster, True), as_json)


@calibration_app.command("unfreeze")
def unfreeze(cluster: str, as_json: JsonOpt = False) -> None:
    """Let the constants follow new observations again."""
    _print(call_api(api_client().freeze_calibration, cluster, False), as_json)


@calibration_app.command("reset")
def reset(cluster: str, as_json: JsonOpt = False) -> None:
    """Back to the advisor's own constants; only attempts ending from now on are learnt from."""
    _print(call_api(api_client().reset_calibration, cluster), as_json)


@calibration_app.command("export")
def export(cluster: str) -> None:
    """The cluster's calibration as JSON, for ``import`` on a cluster of the same hardware."""
    print_json(call_api(api_client().calibration, cluster))


@calibration_app.command("import")
def import_(cluster: str, file: Path, as_json: JsonOpt = False) -> None:
    """Start CLUSTER from another cluster's exported constants until its own runs refit."""
    try:
        exported = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        fail(f"cannot read {file}: {exc}", 2)
    _print(call_api(api_client().import_calibration, cluster, exported), as_json)


def _print(shown: dict[str, Any], as_json: bool, observations: bool = False) -> None:
    if as_json:
        print_json(shown)
        return
    console.print(summary(shown), highlight=False)
    if observations and shown["recent"]:
        console.print(_observations(shown["recent"]))


def summary(shown: dict[str, Any]) -> str:
    """One paragraph: calibrated or not, on how many runs, the error, the constants."""
    state = " (frozen)" if shown["frozen"] else ""
    if not shown["observations"]:
        return f"cluster {shown['cluster']}{state}: the advisor's own constants (not calibrated)"
    moved = ", ".join(f"{k} x{v:.3g}" for k, v in sorted(shown["multipliers"].items()))
    if source := shown.get("imported_from"):
        state += f" (imported from cluster {source} until its own runs refit)"
    return (
        f"cluster {shown['cluster']}{state}: calibrated on {shown['observations']} runs, "
        f"typical step-time error {shown['typical_error']:.0%}; {moved}; memory: "
        f"{shown['memory_reason']}"
    )


def _observations(recent: list[dict[str, Any]]) -> Table:
    table = Table("attempt", "job", "predicted step", "measured step", "neighbours", "learnt")
    for o in recent:
        table.add_row(
            o["attempt_id"], o["job_id"], _ms(o["predicted_step_seconds"]),
            _ms(o["step_seconds"]), str(o["neighbours"]), o["skipped"] or "yes",
        )  # fmt: skip
    return table


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"
