"""What ``zeropilot advise`` and ``zeropilot lint`` do (``cli_advice`` declares them): the
memory advisor and the ds_config linter, on this machine with ``service.core`` (installed with
the client), so they work without a running service. Loaded only by those two commands: the
advisor takes longer to import than the rest of the CLI together.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from service.core.advisor import Advice, Candidate, NoPlanFits
from service.core.advisor import advise as advise_job
from service.core.advisor.chart import render_breakdown_svg
from service.core.advisor.constants import DEFAULT_HEADROOM
from service.core.advisor.lint import Finding, has_errors, lint_ds_config
from service.core.advisor.workload import budget_bytes
from service.core.clusters import BackendKind, ClusterProfile
from service.core.messages import plain_message
from service.core.placement import (
    AUTO,
    Option,
    Placement,
    choose,
    cost_words,
    plan_everywhere,
    span,
    summary,
    why_not,
)
from service.core.spec import JobSpec
from zeropilot import advice_explain
from zeropilot.cli_common import console, err, fail, inline_hf_config, print_json, read_mapping

GIB = 1024**3
TABLE_WIDTH = 170  # the candidate table needs it; narrower terminals wrap rather than truncate

PROFILES_ENV = "ZEROPILOT_CLUSTERS__PROFILES_FILE"


def load_job(
    path: Path,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    hf_config: Path | None = None,
) -> JobSpec:
    raw = read_mapping(path, "a job spec")
    inline_hf_config(raw, path.resolve().parent, hf_config)
    resources = dict(raw.get("resources") or {})
    if nodes is not None:
        resources["nodes"] = nodes
    if gpus_per_node is not None:
        resources["gpus_per_node"] = gpus_per_node
    try:
        return JobSpec.model_validate({**raw, "resources": resources})
    except ValidationError as exc:
        fail(f"{path}: {_validation_message(exc)}", 2)


def _validation_message(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {plain_message(e['msg'])}"
        for e in exc.errors()
    )


def profile_for(
    spec: JobSpec, gpu_memory_gib: float | None, path: Path | str = "FILE"
) -> ClusterProfile:
    """The spec's cluster from the configured profiles (``local`` always exists), or any cluster
    described by --gpu-memory-gib and the spec."""
    resources = spec.resources
    known = configured_profiles()
    if resources.cluster in known:
        base = known[resources.cluster]
    elif gpu_memory_gib is None:
        source = os.environ.get(PROFILES_ENV) or "none set"
        fail(
            f"cluster {resources.cluster!r} is not a known cluster profile (known: "
            f"{', '.join(sorted(known))}; {PROFILES_ENV}: {source}). Name the profiles file, "
            f"e.g. `{PROFILES_ENV}=deploy/clusters.example.yaml zeropilot advise {path}`, "
            f"or give the GPU's memory: `zeropilot advise {path} --gpu-memory-gib 80`",
            2,
        )
    else:
        base = ClusterProfile(
            name=resources.cluster,
            kind=BackendKind.KUBERNETES,
            accelerator="gpu",
            cpu_memory_gib=1024,
        )
    update: dict[str, Any] = {
        "gpus_per_node": max(base.gpus_per_node, resources.gpus_per_node),
        "max_nodes": max(base.max_nodes, resources.nodes),
    }
    if gpu_memory_gib is not None:
        if gpu_memory_gib <= 0:
            fail(f"--gpu-memory-gib must be positive, not {gpu_memory_gib}", 2)
        update["gpu_memory_gib"] = gpu_memory_gib
    return base.model_copy(update=update)


def configured_profiles() -> dict[str, ClusterProfile]:
    """The profiles the server would use, from the same setting (a file named by an env var)."""
    from service.settings import get_settings

    try:
        return get_settings().cluster_profiles()
    except (OSError, ValueError, yaml.YAMLError) as exc:
        fail(f"cannot read the cluster profiles ({PROFILES_ENV}): {exc}", 2)


def advise(
    file: Path,
    gpu_memory_gib: float | None,
    nodes: int | None,
    gpus_per_node: int | None,
    as_json: bool,
    chart: Path | None,
    hf_config: Path | None,
    explain: bool = False,
) -> None:
    spec = load_job(file, nodes, gpus_per_node, hf_config)
    if spec.resources.cluster == AUTO:
        if explain:
            fail("--explain needs a named cluster: `cluster: auto` compares clusters instead", 2)
        _advise_placement(spec, as_json)
        return
    profile = profile_for(spec, gpu_memory_gib, file)
    calibration, note, online = None, "", False
    if explain:  # the server's calibration of this cluster, else the advisor's own constants
        calibration, note, online = advice_explain.cluster_calibration(profile.name)
    try:
        advice = advise_job(spec, profile, calibration=calibration)
    except NoPlanFits as exc:
        _print_closest(exc, as_json)
        raise typer.Exit(1) from exc
    except ValueError as exc:
        fail(str(exc), 2)
    if chart is not None:
        budget = budget_bytes(profile, DEFAULT_HEADROOM)
        chart.write_text(render_breakdown_svg(advice.candidates, budget, advice.plan))
    if calibration is not None:
        advice_explain.explain(advice, profile, calibration, note, online, as_json)
    elif as_json:
        print_json(advice.model_dump(mode="json"))
    else:
        _print_advice(advice, profile)


def _advise_placement(spec: JobSpec, as_json: bool) -> None:
    """``cluster: auto``: the job planned for every configured cluster, side by side. Where it
    would start now is the server's to say (its queues); here every cluster counts as free."""
    profiles = configured_profiles()
    options = plan_everywhere(spec, list(profiles.values()), advise_job, lambda _p: None)
    by = spec.resources.placement
    chosen = choose(options, by)
    if as_json:
        rows = [_placement_row(o, profiles[o.cluster], chosen, by) for o in options]
        print_json({"chosen": chosen.cluster if chosen else None, "clusters": rows})
    else:
        table = Table(title="Where the job could run (cluster: auto)")
        keys = ("gpu", "plan", "memory", "pace", "takes", "cost", "why_not")
        columns = ("cluster", "GPU", "plan", "peak / usable GiB", "tok/s", "takes", "cost")
        for column in (*columns, "why not"):
            table.add_column(column, no_wrap=column != "why not")
        for option in options:
            row = _placement_row(option, profiles[option.cluster], chosen, by)
            mark = "\u2192 " if row["chosen"] else ""
            cells = [str(row[k]) for k in keys]
            table.add_row(mark + option.cluster, *cells)
        Console(width=max(console.width, TABLE_WIDTH)).print(table)
        if chosen is not None:
            console.print(summary(options, chosen, by), highlight=False)
    if chosen is None:
        raise typer.Exit(1)


def _placement_row(
    option: Option, profile: ClusterProfile, choice: Option | None, by: Placement
) -> dict[str, Any]:
    gpu = f"{profile.accelerator} {profile.gpu_memory_gib:g} GiB"
    chosen = option is choice
    if option.advice is None:
        empty = dict.fromkeys(("plan", "memory", "pace", "takes", "cost"), "-")
        return {"cluster": option.cluster, "gpu": gpu, **empty, "why_not": option.ruled_out,
                "chosen": False}  # fmt: skip
    plan = option.advice.plan
    peak = plan.per_gpu_bytes.total / GIB
    usable = budget_bytes(profile, DEFAULT_HEADROOM) / GIB
    return {
        "cluster": ("→ " if chosen else "") + option.cluster,
        "gpu": gpu,
        "plan": plan.label(),
        "memory": f"{peak:.2f} / {usable:.2f}",
        "pace": f"{option.tokens_per_second:,.0f}",
        # training.steps at the predicted pace; "-" without a length
        "takes": span(option.duration_s) if option.duration_s is not None else "-",
        # the whole job's at the profile's $/GPU-hour; a step's without a length; "-" unpriced
        "cost": cost_words(option) or "-",
        "why_not": why_not(option, choice, by),
        "chosen": chosen,
    }


def _print_closest(exc: NoPlanFits, as_json: bool) -> None:
    if as_json:
        print_json(
            {
                "error": str(exc),
                "over_by_bytes": exc.over_by_bytes,
                "closest": exc.closest.model_dump(mode="json"),
            }
        )
    else:
        err.print(f"[red]no plan fits:[/red] {exc}", highlight=False)


def _unit(advice: Advice) -> tuple[str, int]:
    """GiB for real models, MiB when everything is smaller than a GiB (the tiny example)."""
    largest = max(c.per_gpu_bytes.total for c in advice.candidates)
    return ("GiB", GIB) if largest >= GIB else ("MiB", 1024**2)


def _print_advice(advice: Advice, profile: ClusterProfile) -> None:
    unit, scale = _unit(advice)
    table = Table(
        title=f"Per-GPU memory ({unit}) on {profile.name}, {profile.gpu_memory_gib:g} GiB per GPU"
    )
    table.add_column("config (\u2192 plan)", no_wrap=True)
    for column in (
        "params",
        "grads",
        "optim",
        "activ",
        "buffers",
        "temps",
        "overhead",
        "total",
        "peak",
        "fits",
        "step s",
        "tok/s",
        "cost",
    ):
        table.add_column(column, justify="right", no_wrap=True)
    for candidate in advice.candidates:
        table.add_row(*_row(candidate, candidate == advice.plan, scale))
    Console(width=max(console.width, TABLE_WIDTH)).print(table)
    console.print(f"[bold]plan:[/bold] {advice.plan.label()}", highlight=False)
    console.print(advice.reason, highlight=False)
    for warning in advice.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)


def _row(candidate: Candidate, chosen: bool, scale: int) -> list[str]:
    b = candidate.per_gpu_bytes
    sizes = [
        b.params,
        b.gradients,
        b.optimizer,
        b.activations,
        b.buffers,
        b.temporaries,
        b.overhead,
        b.total,
    ]
    marker = "\u2192 " if chosen else "  "
    return [
        marker + candidate.label(),
        *(f"{n / scale:.2f}" for n in sizes),
        candidate.peak_phase or "",  # forward / backward / step: where the peak is
        "yes" if candidate.fits else "no",
        "" if candidate.step_seconds is None else f"{candidate.step_seconds:.3f}",
        "" if candidate.tokens_per_second is None else f"{candidate.tokens_per_second:,.0f}",
        f"{candidate.relative_cost:.2f}",
    ]


def lint(ds_config: Path, job: Path | None, gpu_memory_gib: float | None, as_json: bool) -> None:
    config = read_mapping(ds_config, "a DeepSpeed config")
    spec, profile = None, None
    if job is not None:
        spec = load_job(job)
        profile = profile_for(spec, gpu_memory_gib, job)
    findings = lint_ds_config(config, spec, profile)
    if as_json:
        print_json([f.model_dump(mode="json") for f in findings])
    else:
        _print_findings(findings)
    if has_errors(findings):
        raise typer.Exit(1)


def _print_findings(findings: list[Finding]) -> None:
    if not findings:
        console.print("no findings", highlight=False)
        return
    styles = {"error": "red", "warning": "yellow", "info": "cyan"}
    for finding in findings:
        style = styles[finding.severity]
        console.print(
            f"[{style}]{finding.severity}[/{style}] [bold]{finding.key or '(config)'}"
            f"[/bold]: {finding.reason}\n    fix: {finding.fix}",
            highlight=False,
        )
