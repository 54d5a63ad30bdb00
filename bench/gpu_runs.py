"""Real GPU runs next to the advisor's prediction for the same job.

``bench/data/h200_runs.jsonl`` is a copy of ``../shared/data/h200-2026-11-30/runs.jsonl``
(44 DeepSpeed 0.19.8 runs of Hugging Face Llama models on one H200, made by
``bench/gpu_probe.py``), kept in the repository so that CI checks the advisor against it.
Each run becomes the Workload and Layout the advisor would use, with the run's exact
parameter count and the knobs its ds_config gives DeepSpeed (its defaults where unset).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.core.advisor.constants import CALIBRATION, Calibration
from service.core.advisor.hardware import ACCELERATORS
from service.core.advisor.layout import Knobs, Layout, Workload
from service.core.advisor.memory import Prediction, predict_memory
from service.core.advisor.shape import bare_shape
from service.core.advisor.step_time import StepTime, predict_step_time

ROOT = Path(__file__).resolve().parents[1]
H200_RUNS = ROOT / "bench" / "data" / "h200_runs.jsonl"
H200_USABLE_GIB = 139.8  # torch.cuda.get_device_properties(0).total_memory on the H200


@dataclass(frozen=True)
class GpuRun:
    record: dict[str, Any]
    work: Workload
    layout: Layout

    @property
    def label(self) -> str:
        s = self.record["spec"]
        offload = "+off(all)" if s.get("offload_param") else ""
        offload = offload or ("+off(opt)" if s.get("offload_optimizer") else "")
        ckpt = "+ckpt" if s["ckpt"] else ""
        extra = " fused" if self.work.optimizer_impl == "fused" else ""
        extra += f" N={self.work.world_size}" if self.work.world_size > 1 else ""
        return f"{s['name']:10} Z{s['stage']}{offload}{ckpt} mb={s['mb']} s={s['seq']}{extra}"

    @property
    def allocated(self) -> int:
        return int(self.record["train_peak"])

    @property
    def reserved(self) -> int:
        return int(self.record["train_reserved"])

    def predict(self, calibration: Calibration = CALIBRATION) -> Prediction:
        return predict_memory(self.work, self.layout, calibration)

    @property
    def concurrent(self) -> int:
        """Other probes that shared the GPU during the run (0: it had the GPU alone)."""
        return int(self.record.get("concurrent", 0))

    @property
    def step_seconds(self) -> float:
        return float(self.record["step_s"])

    @property
    def tokens_per_second(self) -> float:
        return float(self.record["tokens_per_s"])

    @property
    def group(self) -> tuple[str, int, int]:
        """Model, sequence and micro-batch: the runs whose speeds a choice compares."""
        s = self.record["spec"]
        return (s["name"], s["seq"], s["mb"])

    def predict_time(self, calibration: Calibration = CALIBRATION) -> StepTime:
        return predict_step_time(self.work, self.layout, calibration)


def deepspeed_default_knobs(ds_config: dict[str, Any]) -> Knobs:
    """The memory knobs DeepSpeed 0.19.8 uses for this config (its defaults where unset)."""
    zero = ds_config.get("zero_optimization", {})
    stage = zero.get("stage", 0)
    offloads = [zero.get(k, {}) for k in ("offload_optimizer", "offload_param")]
    return Knobs(
        reduce_bucket_size=int(zero.get("reduce_bucket_size", 5e8)),
        allgather_bucket_size=int(zero.get("allgather_bucket_size", 5e8)),
        prefetch_bucket_size=int(zero.get("stage3_prefetch_bucket_size", 5e7)),
        param_persistence_threshold=int(zero.get("stage3_param_persistence_threshold", 1e5)),
        max_live_parameters=int(zero.get("stage3_max_live_parameters", 1e9)),
        overlap_comm=bool(zero.get("overlap_comm", stage == 3)),  # DeepSpeed: on for ZeRO-3
        pin_memory=any(o.get("pin_memory", False) for o in offloads),
        sub_group_size=int(zero.get("sub_group_size", 1e9)),
    )


def run_of(record: dict[str, Any]) -> GpuRun:
    spec, m = record["spec"], record["spec"]["model"]
    shape = bare_shape(
        record["params"], m["hidden"], m["layers"], m["heads"], m["kv_heads"], m["ffn"],
        m["vocab"], False, True,
    )  # fmt: skip
    assert shape.counted_parameters == record["params"], spec["name"]
    optimizer = record["ds_config"]["optimizer"]["params"]
    world = int(record.get("world_size", 1))
    work = Workload(
        shape=shape,
        sequence_length=spec["seq"],
        global_batch=spec["mb"] * world,
        precision="bf16",
        optimizer="adamw",
        optimizer_impl="torch" if optimizer.get("torch_adam") else "fused",
        nodes=1,
        gpus_per_node=world,
        on_cpu=False,
        hardware=ACCELERATORS["h200"],
    )
    layout = Layout(
        stage=spec["stage"],
        offload_optimizer=bool(spec.get("offload_optimizer")),
        offload_param=bool(spec.get("offload_param")),
        checkpointing=bool(spec["ckpt"]),
        micro_batch=spec["mb"],
        accumulation=1,
        knobs=deepspeed_default_knobs(record["ds_config"]),
    )
    return GpuRun(record, work, layout)


def load_gpu_runs(path: Path = H200_RUNS) -> list[GpuRun]:
    """Every run that finished its steps (an out-of-memory row has no training peak)."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [run_of(r) for r in records if r.get("ok")]
