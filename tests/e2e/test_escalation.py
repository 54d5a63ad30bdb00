"""Out-of-memory escalation end to end: classify, climb a rung, resume from the checkpoint.

There is no GPU here, so the out-of-memory error is a stand-in: the example training raises
torch's real OutOfMemoryError at step 5 unless activation checkpointing is on, as a model whose
activations do not fit would. Everything after the raise is the real path: the runtime helper
tags it, the reconcile classifies it, the ladder picks the next rung, and attempt 2 resumes from
the step-3 checkpoint.
"""

from __future__ import annotations

import pytest

from tests.e2e.stack import Api, Stack
from tests.integration.helpers import tiny_spec

pytestmark = pytest.mark.slow

ARGS = ["--steps", "8", "--checkpoint-interval", "3", "--oom-without-checkpointing-at-step", "5"]


def test_oom_climbs_the_ladder_and_resumes_from_the_checkpoint(stack: Stack, api: Api) -> None:
    stack.start_worker("w1")
    job = api.submit(tiny_spec(args=ARGS, checkpoint={"interval_steps": 3}))
    assert job["plan"]["activation_checkpointing"] is False
    done = api.wait_for(job["id"], {"SUCCEEDED", "FAILED"}, stack, timeout_s=600)
    assert done["status"] == "SUCCEEDED", (done["message"], stack.logs())

    first, second = done["attempts"]
    assert (first["status"], first["failure_class"]) == ("FAILED", "OOM_GPU")
    assert second["status"] == "SUCCEEDED"
    assert second["rung"] == "turn on activation checkpointing"
    assert second["plan"]["activation_checkpointing"] is True
    assert second["plan"]["ds_config"]["train_batch_size"] == 8  # global batch unchanged
    assert done["plan"] == second["plan"]

    checkpoint = next(c for c in done["checkpoints"] if c["step"] == 3)
    assert checkpoint["attempt_id"] == first["id"]
    assert (second["resumed_from"], second["resume_method"]) == (checkpoint["path"], "native")
    resumed_steps = [m["step"] for m in done["metrics"] if m["attempt_id"] == second["id"]]
    assert resumed_steps == [4, 5, 6, 7, 8]  # continued after step 3, not from scratch

    job_moves = [e["to_status"] for e in done["events"] if e["subject"] == "job"]
    assert job_moves == [
        "PENDING",
        "QUEUED",
        "LAUNCHING",
        "RUNNING",
        "ESCALATING",
        "QUEUED",
        "LAUNCHING",
        "RUNNING",
        "SUCCEEDED",
    ]
    escalation = next(e for e in done["events"] if e["to_status"] == "ESCALATING")
    assert escalation["reason"] == "OOM_GPU: turn on activation checkpointing"


def test_oom_without_escalation_fails_with_its_class(stack: Stack, api: Api) -> None:
    stack.start_worker("w1")
    spec = tiny_spec(args=["--steps", "4", "--oom-at-step", "2"], escalation={"enabled": False})
    job = api.submit(spec)
    done = api.wait_for(job["id"], {"SUCCEEDED", "FAILED"}, stack)
    assert (done["status"], done["failure_class"]) == ("FAILED", "OOM_GPU")
    assert len(done["attempts"]) == 1
