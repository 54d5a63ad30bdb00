"""The Hugging Face Trainer runs the advisor's ds_configs unchanged, through zeropilot.hf.

Each run is the example (examples/hf-trainer/train.py) as one CPU process with a real DeepSpeed
engine: every ZeRO stage and offload mode the advisor renders trains two steps and saves a
Trainer checkpoint; a native resume continues the Trainer's own checkpoint; a weights resume
(ZeRO-1 to ZeRO-3) loads the consolidated weights and counts on from the checkpoint's step.
Two ranks under each of ZeRO-1, 2 and 3 run through the whole service in
tests/e2e/test_hf_trainer.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from service.core.advisor import advise
from service.core.clusters import LOCAL_PROFILE
from service.core.spec import JobSpec
from tests.e2e.stack import free_port
from tests.integration.helpers import REPO

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "hf-trainer"


def rendered_configs(precision: str = "fp32") -> dict[tuple[int, str, str], dict[str, Any]]:
    """One ds_config per (stage, optimizer offload, parameter offload) the advisor renders."""
    spec = JobSpec.model_validate(
        {
            "name": "hf",
            "entrypoint": "train.py",
            "model": {"hf_config": json.loads((EXAMPLE / "config.json").read_text())},
            "training": {
                "sequence_length": 64,
                "global_batch_size": 4,
                "precision": precision,
                "optimizer_impl": "torch",  # no fused CUDA kernel to build on the CPU
            },
            "resources": {"cluster": "local", "nodes": 1, "gpus_per_node": 1},
        }
    )
    configs = {}
    for candidate in advise(spec, LOCAL_PROFILE).candidates:
        key = (candidate.zero_stage, candidate.offload_optimizer, candidate.offload_param)
        configs.setdefault(key, candidate.ds_config)
    return configs


CONFIGS = rendered_configs()


def train(folder: Path, config: dict[str, Any], steps: int, **env: str) -> dict[str, Any]:
    """Run the example; return the trainer_state.json of its last checkpoint."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ds_config.json").write_text(json.dumps(config))
    variables = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
        "ZEROPILOT_DS_CONFIG": str(folder / "ds_config.json"),
        "ZEROPILOT_CHECKPOINT_DIR": str(folder / "checkpoints"),
        "ZEROPILOT_CHECKPOINT_INTERVAL": "2",
        **env,
    }
    argv = [sys.executable, str(EXAMPLE / "train.py"), "--max-steps", str(steps)]
    done = subprocess.run(argv, env=variables, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    state = folder / "checkpoints" / f"checkpoint-{steps}" / "trainer_state.json"
    result: dict[str, Any] = json.loads(state.read_text())
    return result


def test_the_advisor_renders_every_stage_and_offload_mode() -> None:
    assert set(CONFIGS) == {
        (0, "none", "none"),
        (1, "none", "none"),
        (1, "cpu", "none"),
        (2, "none", "none"),
        (2, "cpu", "none"),
        (3, "none", "none"),
        (3, "cpu", "none"),
        (3, "cpu", "cpu"),
    }
    for config in CONFIGS.values():  # nothing left for the Trainer to fill in
        assert "auto" not in json.dumps(config)


@pytest.mark.parametrize("key", sorted(CONFIGS), ids=lambda k: "zero{}-opt_{}-param_{}".format(*k))
def test_the_trainer_trains_and_saves_with_each_rendered_config(
    tmp_path: Path, key: tuple[int, str, str]
) -> None:
    state = train(tmp_path, CONFIGS[key], steps=2)
    assert state["global_step"] == 2
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert len(losses) == 2 and all(loss > 0 for loss in losses)
    checkpoint = tmp_path / "checkpoints" / "checkpoint-2"
    assert (checkpoint / "latest").read_text().strip() == "global_step2"


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_trainers_arguments_agree_with_each_precision(tmp_path: Path, precision: str) -> None:
    """The Trainer checks the config against its arguments as it builds them (no training:
    fp16 needs a GPU under DeepSpeed)."""
    config = rendered_configs(precision)[(2, "none", "none")]
    (tmp_path / "ds.json").write_text(json.dumps(config))
    code = (
        "from zeropilot.hf import training_arguments as t; a = t(max_steps=1, report_to='none');"
        "print(a.bf16, a.fp16, a.per_device_train_batch_size, a.hf_deepspeed_config.dtype())"
    )
    env = {**os.environ, "ZEROPILOT_DS_CONFIG": str(tmp_path / "ds.json")}
    env["ZEROPILOT_CHECKPOINT_DIR"] = str(tmp_path / "checkpoints")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    bf16, fp16 = precision == "bf16", precision == "fp16"
    micro = config["train_micro_batch_size_per_gpu"]
    dtype = "torch.bfloat16" if bf16 else "torch.float16"
    assert done.stdout.split()[-4:] == [str(bf16), str(fp16), str(micro), dtype]


def test_a_native_resume_continues_the_trainers_checkpoint(tmp_path: Path) -> None:
    config = CONFIGS[(1, "none", "none")]
    train(tmp_path / "first", config, steps=2)
    checkpoint = tmp_path / "first" / "checkpoints" / "checkpoint-2"
    state = train(
        tmp_path / "second",
        config,
        steps=4,
        ZEROPILOT_RESUME_FROM=str(checkpoint),
        ZEROPILOT_RESUME_METHOD="native",
    )
    steps = [entry["step"] for entry in state["log_history"] if "loss" in entry]
    assert steps == [1, 2, 3, 4]  # the first attempt's history, then steps 3 and 4


def test_a_weights_resume_across_stages_counts_on_from_the_checkpoint(tmp_path: Path) -> None:
    """The resumed run reads the data from its start again (a fresh optimizer, a fresh data
    order: the weights method keeps only the weights), so its first batch is the first run's
    first: without the weights its loss would be that of step 1 (the same seed, the same
    initial model); with them it is lower (5% here, against float reordering's 1e-6)."""
    first = train(tmp_path / "first", CONFIGS[(1, "none", "none")], steps=2)
    checkpoint = tmp_path / "first" / "checkpoints" / "checkpoint-2"
    state = train(
        tmp_path / "second",
        CONFIGS[(3, "none", "none")],
        steps=4,
        ZEROPILOT_RESUME_FROM=str(checkpoint),
        ZEROPILOT_RESUME_METHOD="weights",
    )
    logged = {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}
    assert sorted(logged) == [3, 4]  # counted on from step 2, not from 0
    initial = next(e["loss"] for e in first["log_history"] if e.get("step") == 1)
    assert logged[3] < 0.99 * initial  # the mean over one step, not over steps 0..3
    assert logged[3] > 0.5 * initial
