"""Hugging Face Trainer jobs through the whole service: examples/hf-trainer over HTTP.

Real processes: the API, a Celery worker, the local backend, DeepSpeed's launcher and two gloo
ranks of the Trainer running the advisor's ds_config. The example has no zeropilot code but
``training_arguments`` and ``ZeropilotCallback``.

The OOM is real, provoked as in test_escalation.py: from step 3 the example's ranks cap their
address space (RLIMIT_AS) at CAP_MIB above what they hold between steps. Measured here on one
rank (binary search of the cap over a step after the first, ``MALLOC_MMAP_THRESHOLD_=65536``,
``OMP_NUM_THREADS=1``): a step at sequence 1024 needs 100-110 MiB more at micro-batch 8 and 50-60
MiB at micro-batch 4, so the advisor's first plan (ZeRO-0, micro-batch 8) fails in PyTorch's
CPU allocator. The escalation turns activation checkpointing on (micro-batch 8 kept), which
fits under the same cap.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.stack import Api, Stack
from tests.e2e.test_escalation import zeropilot_status
from tests.e2e.test_graceful_stop import cancel_and_wait, wait_for_steps
from tests.integration.helpers import REPO

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "hf-trainer"
CAP_MIB = 80


def trainer_job(name: str, steps: int, seq_len: int = 64, **changes: Any) -> dict[str, Any]:
    """examples/hf-trainer/job.yaml as the CLI sends it (config.json inlined)."""
    spec: dict[str, Any] = {
        "name": name,
        "entrypoint": "train.py",
        "working_dir": str(EXAMPLE),
        "args": ["--max-steps", str(steps), "--seq-len", str(seq_len)],
        "model": {"hf_config": json.loads((EXAMPLE / "config.json").read_text())},
        "training": {
            "sequence_length": seq_len,
            "global_batch_size": 8,
            "precision": "fp32",
            "optimizer_impl": "torch",
            "learning_rate": 0.003,
        },
        "resources": {"cluster": "local", "nodes": 1, "gpus_per_node": 2},
        "checkpoint": {"interval_steps": 2},
        "env": {"OMP_NUM_THREADS": "1"},
    }
    spec.update(changes)
    return spec


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_trainer_job_reports_its_metrics_and_checkpoints(
    stack: Stack, api: Api, stage: int
) -> None:
    stack.start_worker("w1")
    job = api.submit(trainer_job(f"hf-zero{stage}", steps=4, zero={"stage": stage}))
    done = api.wait_for(job["id"], {"SUCCEEDED", "FAILED"}, stack)
    assert done["status"] == "SUCCEEDED", (done["message"], stack.logs())
    (attempt,) = done["attempts"]
    assert attempt["plan"]["zero_stage"] == stage
    assert attempt["plan"]["ds_config"]["zero_optimization"]["stage"] == stage

    points = done["metrics"]
    assert [m["step"] for m in points] == [1, 2, 3, 4]  # rank 0 only: one point per step
    assert all(m["loss"] > 0 and m["tokens_per_s"] > 0 for m in points[1:])
    assert all({"learning_rate", "grad_norm"} <= set(m["extra"]) for m in points)
    assert all(m["memory_peak_bytes"] > 0 for m in points)
    assert set(attempt["runtime_evidence"]["devices"]) == {"0", "1"}

    saved = done["checkpoints"]
    assert [c["step"] for c in saved] == [2, 4]
    for checkpoint in saved:
        folder = Path(checkpoint["path"])
        assert folder.name == f"checkpoint-{checkpoint['step']}"
        assert (folder / "latest").read_text() == f"global_step{checkpoint['step']}"
        state = json.loads((folder / "trainer_state.json").read_text())
        assert state["global_step"] == checkpoint["step"]
        assert checkpoint["save_seconds"] is not None and checkpoint["save_seconds"] > 0
    assert Path(saved[0]["path"]).parent == stack.data_dir / "jobs" / job["id"] / "checkpoints"


def metric_value(exported: str, name: str, label: str) -> float:
    """The value of the Prometheus sample ``name{...label...}`` in a /metrics page."""
    (value,) = [
        float(line.rsplit(" ", 1)[1])
        for line in exported.splitlines()
        if line.startswith(name + "{") and label in line
    ]
    return value


def trainer_arguments(checkpoint: Path) -> Any:
    """The TrainingArguments the Trainer saved with a checkpoint (a pickle the test trusts)."""
    import torch

    return torch.load(checkpoint / "training_args.bin", weights_only=False)


def capped_job() -> dict[str, Any]:
    spec = trainer_job("hf-capped", steps=5, seq_len=1024)
    spec["args"] += ["--memory-cap-mib", str(CAP_MIB), "--memory-cap-at-step", "3"]
    spec["training"]["global_batch_size"] = 16
    spec["env"] |= {"MALLOC_MMAP_THRESHOLD_": "65536"}
    return spec


def test_a_trainer_job_that_runs_out_of_memory_is_replanned_and_resumes(
    stack: Stack, api: Api, token: str
) -> None:
    stack.start_worker("w1")
    job = api.submit(capped_job())
    done = api.wait_for(job["id"], {"SUCCEEDED", "FAILED"}, stack, timeout_s=900)
    assert done["status"] == "SUCCEEDED", (done["message"], stack.logs())
    first, second = done["attempts"]
    assert (first["status"], first["failure_class"]) == ("FAILED", "OOM_HOST")
    assert first["plan"]["micro_batch_size"] == 8
    assert first["failure_evidence"]["source"] == "runtime tag"  # the callback's excepthook
    assert first["failure_evidence"]["numbers"]["limit_bytes"] > 0

    assert second["status"] == "SUCCEEDED"
    # The escalation's cheapest fix here is checkpointing (with micro-batch 8 kept); the same
    # script, unchanged, ran with it on because training_arguments read the new plan.
    assert second["rung"] == "activation checkpointing on"
    plan = second["plan"]
    assert (plan["zero_stage"], plan["micro_batch_size"], plan["activation_checkpointing"]) == (
        0,
        8,
        True,
    )
    checkpoint = next(c for c in done["checkpoints"] if c["step"] == 2)
    assert checkpoint["attempt_id"] == first["id"]
    assert (second["resumed_from"], second["resume_method"]) == (checkpoint["path"], "native")
    resumed = [m["step"] for m in done["metrics"] if m["attempt_id"] == second["id"]]
    assert resumed == [3, 4, 5]  # the Trainer's own resume, after step 2
    final = Path(next(c for c in done["checkpoints"] if c["step"] == 5)["path"])
    history = json.loads((final / "trainer_state.json").read_text())["log_history"]
    assert [e["step"] for e in history if "loss" in e] == [1, 2, 3, 4, 5]
    assert trainer_arguments(Path(checkpoint["path"])).activation_checkpointing is False
    assert trainer_arguments(final).activation_checkpointing is True

    status = zeropilot_status(stack, token, job["id"])
    print(status)
    assert "attempt 2: SUCCEEDED ZeRO-0 +ckpt mb=8x1 (activation checkpointing on)" in status


def test_a_cancelled_trainer_job_saves_the_step_it_reached_on_every_rank(
    stack: Stack, api: Api
) -> None:
    stack.start_worker("w1")
    spec = trainer_job(
        "hf-graceful", steps=100_000, checkpoint={"interval_steps": 100_000}, zero={"stage": 2}
    )
    job = api.submit(spec)
    wait_for_steps(api, job["id"], 3, stack)

    done = cancel_and_wait(api, job["id"], stack)

    (attempt,) = done["attempts"]
    (saved,) = done["checkpoints"]
    assert attempt["status"] == "CANCELLED"
    assert attempt["exit_code"] == 75  # STOPPED_EXIT_CODE from both ranks, after the save
    assert saved["step"] >= max(m["step"] for m in done["metrics"])
    folder = Path(saved["path"])
    assert folder.name == f"checkpoint-{saved['step']}"
    tag = f"global_step{saved['step']}"
    assert (folder / "latest").read_text() == tag
    shards = sorted(p.name for p in (folder / tag).glob("*optim_states.pt"))
    assert len(shards) == 2  # both ranks saved the same step
    reason = [e["reason"] for e in done["events"] if e["subject"] == "attempt"][-1]
    assert f"stopped on request at step {saved['step']} after saving {saved['path']}" in reason


def test_the_worker_deletes_old_trainer_checkpoints_during_the_run(
    stack: Stack, api: Api, token: str
) -> None:
    stack.start_worker("w1")
    spec = trainer_job(
        "hf-retention",
        steps=10,
        zero={"stage": 2},
        checkpoint={"interval_steps": 1, "keep_last": 2, "keep_every_steps": 5},
    )
    job = api.submit(spec)
    done = api.wait_for(job["id"], {"SUCCEEDED", "FAILED"}, stack)
    assert done["status"] == "SUCCEEDED", (done["message"], stack.logs())
    folder = stack.data_dir / "jobs" / job["id"] / "checkpoints"
    deadline = time.monotonic() + 60  # the last report's pass may follow the exit by a tick
    while len(list(folder.glob("checkpoint-*"))) > 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sorted(int(p.name.split("-")[1]) for p in folder.glob("checkpoint-*")) == [5, 9, 10]

    done = api.job(job["id"])
    deletions = [e for e in done["events"] if e["subject"] == "storage"]
    assert len(deletions) == 7
    finished = next(e for e in done["events"] if e["to_status"] == "SUCCEEDED")
    assert deletions[0]["created_at"] < finished["created_at"]  # during the run, not after
    kept = [c for c in done["checkpoints"] if c["deleted_at"] is None]
    assert [c["step"] for c in kept] == [5, 9, 10]
    assert done["checkpoint_bytes"] == sum(c["size_bytes"] for c in kept) > 0

    exported = httpx.get(f"{stack.url}/metrics", timeout=30).text  # the worker's, added up
    kept_bytes = metric_value(exported, "zeropilot_job_checkpoint_bytes", f'job="{job["id"]}"')
    assert kept_bytes == done["checkpoint_bytes"], [
        line for line in exported.splitlines() if "checkpoint" in line
    ]
    deleted = sum(c["size_bytes"] for c in done["checkpoints"] if c["deleted_at"])
    assert metric_value(exported, "zeropilot_checkpoint_bytes_deleted_total", "local") == deleted

    status = zeropilot_status(stack, token, job["id"])
    print(status)  # the README shows a run of this
    assert "checkpoints: 3 kept (" in status and "7 deleted" in status
    assert "storage DELETED" in status
