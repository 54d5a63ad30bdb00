"""Resuming across a change of ZeRO stage with real DeepSpeed, as an escalation does.

A ZeRO-1 run saves a checkpoint at step 10; later attempts resume from it at other stages, the
way ``service.db.attempts.resume_method`` chooses. A resume that restored the weights gives the
native continuation's loss at step 11, and one that also restored the optimizer gives it at
step 12 too, within SAME_LOSS_RTOL. The model runs in bf16 and another stage runs the step
through other code (ZeRO-3's parameter gathering, differently partitioned reductions), so
equality to 4 decimals held where it was written and failed elsewhere, this machine included:
ZeRO-3 on the restored weights gave 3.1083 for the native 3.1096 at step 11 (4.2e-4 relative,
below bf16's resolution; its exact cause was not traced). A resume that lost the Adam moments
was 1.0% off at step 12 (2.8993 for 2.8711), and lost weights move step 11 by far more (the
loss falls 8% a step here). The tolerance is bf16's unit roundoff, 2**-8: wider than the
reordering, 2.5 times narrower than a lost optimizer, and the ZeRO-3 test checks that it does
tell a restarted optimizer apart.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from service.core.clusters import LOCAL_PROFILE
from service.db.attempts import resume_method
from tests.integration.helpers import REPO
from workers.backends import local
from workers.backends.base import BackendState, LaunchRequest
from workers.backends.shm import PREFIX, SHM_DIR

pytestmark = pytest.mark.slow

LOSS = re.compile(r"^step +(\d+) loss ([0-9.]+)", re.MULTILINE)
SAME_LOSS_RTOL = 2**-8  # bf16's unit roundoff; see the module docstring


def run(folder: Path, stage: int, steps: int, resume: tuple[Path, str] | None = None) -> str:
    """Train the tiny example at ``stage`` on 2 CPU ranks; return rank 0's log."""
    folder.mkdir(parents=True)
    ds_config: dict[str, object] = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "torch_adam": True}},
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 1000,
    }
    env = {"ZEROPILOT_CHECKPOINT_DIR": str(folder / "checkpoints")}
    if resume is not None:
        env |= {"ZEROPILOT_RESUME_FROM": str(resume[0]), "ZEROPILOT_RESUME_METHOD": resume[1]}
        if resume[1] == "universal":  # as service.db.attempts renders it
            ds_config["checkpoint"] = {"load_universal": True}
    (folder / "ds_config.json").write_text(json.dumps(ds_config))
    ref = local.submit(
        LaunchRequest(
            name=f"zp-resume-{folder.name}",
            attempt_dir=folder,
            nodes=1,
            procs_per_node=2,
            entrypoint="train_tiny.py",
            args=("--steps", str(steps), "--checkpoint-interval", "10"),
            ds_config_path=folder / "ds_config.json",
            env=env,
            working_dir=REPO / "examples",
            profile=LOCAL_PROFILE,
            python=sys.executable,
        )
    )
    deadline = time.monotonic() + 300  # a hang guard, not a timing assertion
    while not (status := local.poll(LOCAL_PROFILE, ref)).state.terminal:
        assert time.monotonic() < deadline, local.logs(LOCAL_PROFILE, ref)
        time.sleep(0.5)
    log = local.logs(LOCAL_PROFILE, ref, tail_lines=400)
    assert status.state == BackendState.SUCCEEDED, log
    port = json.loads((folder / "launch.json").read_text())["master"]["port"]
    buffers = f"{PREFIX}_{os.getuid()}_127.0.0.1_{port}_*"  # DeepSpeed's CPU all-reduce memory
    assert not list(SHM_DIR.glob(buffers)), "the supervisor left them in /dev/shm"
    return log


def losses(log: str) -> dict[int, float]:
    return {int(step): float(loss) for step, loss in LOSS.findall(log)}


def same_loss(resumed: float, native: float) -> bool:
    return resumed == pytest.approx(native, rel=SAME_LOSS_RTOL)


@pytest.fixture(scope="module")
def zero1(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, float]]:
    """A ZeRO-1 checkpoint at step 10, and the losses of its native continuation."""
    root = tmp_path_factory.mktemp("resume")
    run(root / "first", stage=1, steps=10)
    checkpoint = root / "first" / "checkpoints" / "global_step10"
    native = run(root / "native", stage=1, steps=12, resume=(checkpoint, "native"))
    return checkpoint, losses(native)


@pytest.mark.parametrize(
    ("before", "after", "method"),
    [(1, 1, "native"), (1, 2, "universal"), (2, 1, "universal"), (0, 1, "weights"),
     (1, 3, "weights"), (2, 3, "weights"), (0, 3, "weights")],
)  # fmt: skip
def test_the_resume_method_follows_what_deepspeed_can_convert(
    before: int, after: int, method: str
) -> None:
    assert resume_method(before, after) == method


def test_zero1_to_zero2_through_a_universal_checkpoint_keeps_the_optimizer(
    zero1: tuple[Path, dict[int, float]], tmp_path: Path
) -> None:
    checkpoint, native = zero1

    log = run(tmp_path / "z2", stage=2, steps=12, resume=(checkpoint, "universal"))

    assert "resumed from" in log and "global_step10_universal at step 10 (universal)" in log
    assert (checkpoint.parent / "global_step10_universal" / ".zeropilot-converted").exists()
    assert same_loss(losses(log)[11], native[11])  # the same weights
    assert same_loss(losses(log)[12], native[12])  # and the same Adam moments after one update


def test_zero1_to_zero3_resumes_the_consolidated_weights(
    zero1: tuple[Path, dict[int, float]], tmp_path: Path
) -> None:
    checkpoint, native = zero1

    log = run(tmp_path / "z3", stage=3, steps=12, resume=(checkpoint, "weights"))

    assert "global_step10 at step 10 (weights)" in log
    assert same_loss(losses(log)[11], native[11])
    assert sorted(losses(log)) == [11, 12]  # steps 1-10 are not trained again
    # DeepSpeed converts no optimizer state into ZeRO-3 (README): the moments start afresh, and
    # the tolerance is narrow enough to see it, so the universal test above can tell.
    assert not same_loss(losses(log)[12], native[12])
