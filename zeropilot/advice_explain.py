"""``zeropilot advise --explain``: the plan and its runner-ups with the cluster's calibrated
constants, their error and why each other option lost. The calibration comes from the server
(``GET /v1/clusters/{cluster}/calibration``, one try); offline, or where the server does not know
the cluster, the advisor's own constants are used and the output says so.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from service.core.advisor import Advice
from service.core.advisor.calibration import ClusterCalibration, restored
from service.core.advisor.calibration_memory import MemoryCorrection
from service.core.advisor.calibration_time import KNOBS
from service.core.advisor.candidates import Budgets
from service.core.advisor.constants import CALIBRATION, DEFAULT_HEADROOM
from service.core.advisor.models import format_bytes
from service.core.advisor.runner_ups import Rival, rivals
from service.core.advisor.workload import budget_bytes, host_budget_bytes
from service.core.clusters import ClusterProfile
from zeropilot import credentials
from zeropilot.cli_calibration import summary
from zeropilot.cli_common import console, print_json
from zeropilot.client import ApiError, Client, format_detail
from zeropilot.transport import TransportError

SERVER_TIMEOUT_S = 5.0  # advise works offline: a server that does not answer soon is not waited for
TABLE_WIDTH = 170


def cluster_calibration(cluster: str) -> tuple[ClusterCalibration, str, bool]:
    """The cluster's calibration from the server, what it is in words, and whether the server
    gave it; the advisor's own constants when it did not."""
    url, token = credentials.resolve()
    own = ClusterCalibration(constants=CALIBRATION)
    try:
        with Client(url, token, timeout=SERVER_TIMEOUT_S) as client:
            shown = client.calibration(cluster, tries=1)
    except ApiError as exc:
        answer = f"{exc.status_code} {format_detail(exc.detail)}"
        return own, f"the server at {url} answered {answer}: {_own_words(cluster)}", False
    except (TransportError, ValueError) as exc:
        return own, f"offline (no zeropilot server at {url}: {exc}): {_own_words(cluster)}", False
    return _restored(shown), f"{summary(shown)} (from the server at {url})", True


def _own_words(cluster: str) -> str:
    return f"the advisor's own constants, not calibrated on cluster {cluster}"


def _restored(shown: dict[str, Any]) -> ClusterCalibration:
    if not shown["observations"]:
        return ClusterCalibration(constants=CALIBRATION)
    memory = MemoryCorrection(shown["gpu_memory_share"], shown["cpu_memory_share"],
                              reason=shown["memory_reason"])  # fmt: skip
    return restored(shown["multipliers"], memory, shown["observations"], shown["typical_error"],
                    source=shown.get("imported_from") or "")  # fmt: skip


def budgets_of(profile: ClusterProfile) -> Budgets:
    """The budgets ``advise`` holds candidates to on this profile (its default headroom)."""
    return Budgets(
        budget_bytes(profile, DEFAULT_HEADROOM),
        host_budget_bytes(profile, DEFAULT_HEADROOM),
        budget_bytes(profile, DEFAULT_HEADROOM, offload=True),
    )


def explained(
    advice: Advice,
    profile: ClusterProfile,
    calibration: ClusterCalibration,
    note: str,
    online: bool,
) -> dict[str, Any]:
    """Everything ``--explain`` prints, as data (``--json`` prints it as it is)."""
    listed = rivals(advice, budgets_of(profile), calibration.typical_error)
    return {
        "cluster": profile.name,
        "calibration": {
            "from_server": online,
            "calibrated": calibration.observations > 0,
            "says": note,
            "runs": calibration.observations,
            "typical_error": calibration.typical_error if calibration.observations else None,
            "constants": _constants(calibration),
            "memory": calibration.memory.reason if calibration.observations else None,
        },
        "options": [_option(r) for r in listed],
        "plan": advice.plan.label(),
        "reason": advice.reason,
    }


def _constants(calibration: ClusterCalibration) -> list[dict[str, Any]]:
    rows = []
    for knob in KNOBS:
        prior = getattr(CALIBRATION.speeds, knob.name)
        value = getattr(calibration.constants.speeds, knob.name)
        rows.append({"name": knob.name, "advisor": prior, "calibrated": value,
                     "multiplier": value / prior})  # fmt: skip
    return rows


def _option(r: Rival) -> dict[str, Any]:
    c = r.candidate
    return {
        "option": c.label(), "zero_stage": c.zero_stage, "offload_optimizer": c.offload_optimizer,
        "offload_param": c.offload_param, "activation_checkpointing": c.activation_checkpointing,
        "micro_batch_size": c.micro_batch_size,
        "gradient_accumulation_steps": c.gradient_accumulation_steps,
        "step_seconds": c.step_seconds, "tokens_per_second": c.tokens_per_second,
        "per_gpu_bytes": c.per_gpu_bytes.total, "cpu_bytes_per_node": c.cpu_bytes_per_node,
        "fits": c.fits, "outcome": r.outcome, "why": r.why, "slower_by": r.slower_by,
    }  # fmt: skip


def print_explained(shown: dict[str, Any]) -> None:
    console.print(shown["calibration"]["says"], highlight=False)
    wide = Console(width=max(console.width, TABLE_WIDTH))
    wide.print(_constants_table(shown["calibration"]))
    wide.print(_options_table(shown))
    console.print(f"plan: {shown['plan']}", highlight=False)
    console.print(shown["reason"], highlight=False)


def _constants_table(calibration: dict[str, Any]) -> Table:
    title = "Step-time constants" + ("" if calibration["calibrated"] else " (not calibrated)")
    table = Table("constant", "advisor's", "x fitted", "used", title=title)
    for row in calibration["constants"]:
        table.add_row(row["name"], f"{row['advisor']:.4g}", f"{row['multiplier']:.3g}",
                      f"{row['calibrated']:.4g}")  # fmt: skip
    return table


def _options_table(shown: dict[str, Any]) -> Table:
    error = shown["calibration"]["typical_error"]
    band = f" \u00b1{error:.0%}" if error is not None else ""
    title = (
        f"The plan and its runner-ups on {shown['cluster']}: step time"
        + (f" \u00b1 the calibration's typical error ({error:.0%})" if error is not None
           else " from the advisor's constants, its error on this cluster not measured")
    )  # fmt: skip
    table = Table("option", "step", "tok/s", "per GPU", "outcome", title=title)
    for o in shown["options"]:
        mark = "\u2192 " if o["outcome"] == "chosen" else "  "
        step = "-" if o["step_seconds"] is None else f"{o['step_seconds'] * 1000:.1f} ms{band}"
        rate = "-" if o["tokens_per_second"] is None else f"{o['tokens_per_second']:,.0f}"
        table.add_row(mark + o["option"], step, rate, format_bytes(o["per_gpu_bytes"]), o["why"])
    return table


def explain(
    advice: Advice, profile: ClusterProfile, calibration: ClusterCalibration, note: str,
    online: bool, as_json: bool,
) -> None:  # fmt: skip
    shown = explained(advice, profile, calibration, note, online)
    if as_json:
        print_json(shown)
    else:
        print_explained(shown)
