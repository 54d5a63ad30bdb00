"""``zeropilot advise`` and ``zeropilot lint``: the memory advisor and the ds_config linter, here.

Both compute on this machine with ``service.core`` (installed with the client), so they work
without a running service. Exit codes: 0 fine, 1 nothing fits / an error finding, 2 bad input.
Declared here, done in ``advice_report``: importing the advisor took 160 of the CLI's 350 ms
of start-up, which every ``zeropilot submit`` paid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from zeropilot.cli_common import JsonOpt

GpuMemoryOpt = Annotated[
    float | None, typer.Option("--gpu-memory-gib", help="Memory per GPU (per rank on CPU).")
]
HfConfigOpt = Annotated[
    Path | None,
    typer.Option("--hf-config", help="A Hugging Face config.json to plan the model from."),
]


def advise_command(
    file: Annotated[Path, typer.Argument(help="Job spec, YAML or JSON.")],
    gpu_memory_gib: GpuMemoryOpt = None,
    nodes: Annotated[int | None, typer.Option("--nodes", help="Override resources.nodes.")] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option("--gpus-per-node", help="Override resources.gpus_per_node.")
    ] = None,
    as_json: JsonOpt = False,
    chart: Annotated[
        Path | None, typer.Option("--chart", help="Write an SVG of each candidate's memory.")
    ] = None,
    hf_config: HfConfigOpt = None,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain",
            help="The plan and runner-ups with the server's calibrated constants and their "
            "error, and why each other option lost (offline: the advisor's own constants).",
        ),
    ] = False,
) -> None:
    """Predict per-GPU memory for every DeepSpeed configuration of a job and pick one."""
    from zeropilot import advice_report  # the advisor, loaded by this command alone

    advice_report.advise(
        file, gpu_memory_gib, nodes, gpus_per_node, as_json, chart, hf_config, explain
    )


def lint_command(
    ds_config: Annotated[Path, typer.Argument(help="The ds_config.json to review.")],
    job: Annotated[
        Path | None, typer.Option("--job", help="Job spec: adds the memory checks.")
    ] = None,
    gpu_memory_gib: GpuMemoryOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Review a DeepSpeed config against DeepSpeed's rules and the ZeRO pitfalls."""
    from zeropilot import advice_report  # the advisor, loaded by this command alone

    advice_report.lint(ds_config, job, gpu_memory_gib, as_json)
