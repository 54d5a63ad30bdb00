"""Shared by the fit and the accuracy table: measured runs next to the advisor's prediction.

Each measured point (one rank of one run, one micro-batch / sequence / checkpointing setting) is
turned into the Workload and Layout the advisor would use, with the run's exact parameter count
and its rendered ds_config's knobs, so prediction and measurement describe the same job.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.core.advisor.constants import CALIBRATION, Calibration  # noqa: E402
from service.core.advisor.layout import Layout, Workload, model_sized_knobs  # noqa: E402
from service.core.advisor.memory import Prediction, predict_memory  # noqa: E402
from service.core.advisor.render import knobs_from_overrides  # noqa: E402
from service.core.advisor.shape import ModelShape, bare_shape  # noqa: E402

DATA = ROOT / "bench" / "data" / "cpu_measurements.json"


@dataclass(frozen=True)
class Point:
    run: dict[str, Any]
    measured: dict[str, Any]
    work: Workload
    layout: Layout

    @property
    def label(self) -> str:
        r, m = self.run, self.measured
        offload = {"none": "", "optimizer": "+off(opt)", "all": "+off(all)"}[r["offload"]]
        ckpt = "+ckpt" if m["ckpt"] else ""
        return (
            f"{r['model_name']:6} {r['precision']} N={self.work.world_size} "
            f"Z{r['stage']}{offload}{ckpt} mb={m['micro']} s={m['seq']}"
        )

    def held(self) -> int:
        return int(self.measured["held_total"])

    def peak(self) -> int:
        return int(self.measured["held_total"] + self.measured["peak_delta"])

    def phase_peak(self, phase: str) -> int:
        key = "peak_delta_step" if phase == "step" else "peak_delta_fwd_bwd"
        return int(self.measured["held_total"] + self.measured[key])

    def predict(self, calibration: Calibration = CALIBRATION) -> Prediction:
        return predict_memory(self.work, self.layout, calibration)


def load_runs(path: Path = DATA) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = json.loads(path.read_text())["runs"]
    return [r for r in runs if "peak_delta_step" in r["ranks"][0]["points"][0]]


def shape_of(run: dict[str, Any], parameters: int) -> ModelShape:
    m = run["model"]
    h, heads = m["hidden"], m["heads"]
    return bare_shape(parameters, h, m["layers"], heads, heads, 4 * h, m["vocab"], False, False)


def points(runs: list[dict[str, Any]]) -> Iterator[Point]:
    """Every measured point, taken from the rank with the highest peak (the budget must hold on
    every rank; ranks differ by up to 15% here, ZeRO-3 with checkpointing the most)."""
    for run in runs:
        record = run["ranks"][0]
        world = run.get("world_size", len(run["ranks"]))
        work = Workload(
            shape=shape_of(run, record["parameters"]),
            sequence_length=run["max_seq"],
            global_batch=world,
            precision=run["precision"],
            optimizer="adamw",
            optimizer_impl="torch",
            nodes=1,
            gpus_per_node=world,
            on_cpu=True,
        )
        stage = run["stage"]
        knobs = knobs_from_overrides(
            model_sized_knobs(record["parameters"], stage), run["ds_config"]
        )
        base = Layout(stage, run["offload"] != "none", run["offload"] == "all", False, 1, 1, knobs)
        for index in range(len(record["points"])):
            measured = max((r["points"][index] for r in run["ranks"]), key=_peak)
            layout = replace(
                base, checkpointing=bool(measured["ckpt"]), micro_batch=measured["micro"]
            )
            yield Point(run, measured, replace(work, sequence_length=measured["seq"]), layout)


def _peak(measured: dict[str, Any]) -> int:
    return int(measured["held_total"] + measured["peak_delta"])
