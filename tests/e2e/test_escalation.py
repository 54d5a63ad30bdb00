"""Escalation end to end on real failures: real DeepSpeed ranks on the CPU through the service.

A real out-of-memory: the example's ranks cap their address space (RLIMIT_AS) from step 3 at
130 MiB above what they hold between steps. Measured here (bench-free, by binary search of the
cap around one forward and backward): the step of this job needs 168 MiB more at micro-batch 8
and 88 MiB at micro-batch 4, so the advisor's first plan (ZeRO-0, micro-batch 8) really fails
in PyTorch's CPU allocator and the plan it re-plans to really fits, each with ~40 MiB of margin.
``MALLOC_MMAP_THRESHOLD_`` makes glibc map every large tensor on its own, so the address space
follows live memory; ``OMP_NUM_THREADS=1`` keeps per-thread buffers the same on any machine.

A real SIGKILL: one rank of a running job is killed with ``kill -9``, as the OOM killer, a node
agent or a person would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import Api, Stack
from tests.integration.helpers import tiny_spec

pytestmark = pytest.mark.slow

CAP_MIB = 130
ACTIVATION_HEAVY = {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "vocab_size": 128}


def capped_job() -> dict[str, Any]:
    args = ["--steps", "5", "--hidden", "128", "--seq-len", "1024", "--checkpoint-interval", "2"]
    args += ["--memory-cap-mib", str(CAP_MIB), "--memory-cap-at-step", "3"]
    return tiny_spec(
        name="capped",
        args=args,
        model=ACTIVATION_HEAVY,
        training={
            "sequence_length": 1024,
            "global_batch_size": 16,
            "precision": "fp32",
            "learning_rate": 0.003,
        },
        env={"MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"},
        checkpoint={"interval_steps": 2},
    )


def test_a_real_host_oom_is_replanned_and_resumes_from_its_checkpoint(
    stack: Stack, api: Api, token: str
) -> None:
    stack.start_worker("w1")
    job = api.submit(capped_job())
    done = api.wait_for(job["id"], {"SUCCEEDED", "FAILED"}, stack, timeout_s=900)
    assert done["status"] == "SUCCEEDED", (done["message"], stack.logs())
    assert len(done["attempts"]) == 2, [(e["subject"], e["reason"]) for e in done["events"]]

    first, second = done["attempts"]
    assert (first["status"], first["failure_class"]) == ("FAILED", "OOM_HOST")
    assert first["plan"]["micro_batch_size"] == 8  # the advisor's first choice, ZeRO-0
    assert "DefaultCPUAllocator: can't allocate memory" in first["failure_message"]
    evidence = first["failure_evidence"]
    assert evidence["source"] == "runtime tag"
    assert evidence["numbers"]["tried_bytes"] > 0
    assert evidence["numbers"]["limit_bytes"] > 0  # the rank's RLIMIT_AS, as it reported it
    assert 0 < evidence["missing_bytes"] <= 168 * 2**20  # never more than the step's growth
    assert set(first["runtime_evidence"]["devices"]) == {"0", "1"}  # both ranks at start

    assert second["status"] == "SUCCEEDED"
    assert (second["plan"]["zero_stage"], second["plan"]["micro_batch_size"]) == (0, 4)
    assert second["plan"]["gradient_accumulation_steps"] == 2  # global batch unchanged
    assert second["rung"] == "micro-batch 8 -> 4 (accumulation 1 -> 2)"
    checkpoint = next(c for c in done["checkpoints"] if c["step"] == 2)
    assert checkpoint["attempt_id"] == first["id"]
    assert (second["resumed_from"], second["resume_method"]) == (checkpoint["path"], "native")
    resumed = [m["step"] for m in done["metrics"] if m["attempt_id"] == second["id"]]
    assert resumed == [3, 4, 5]  # continued after step 2, under the same cap

    escalation = next(e for e in done["events"] if e["to_status"] == "ESCALATING")
    assert escalation["reason"].startswith("OOM_HOST: tried ")
    assert "ZeRO-0 mb=8x1 -> ZeRO-0 mb=4x2" in escalation["reason"]
    assert "needed" in escalation["reason"] and "missing" in escalation["reason"]

    status = zeropilot_status(stack, token, job["id"])
    print(status)  # docs/escalation.md shows a run of this
    assert "attempt 1: FAILED ZeRO-0 mb=8x1 (advisor)" in status
    assert "ended: OOM_HOST (exit code 1): RuntimeError: [enforce fail at alloc_cpu.cpp" in status
    assert "evidence: tried " in status and " limit " in status
    assert "re-planned: OOM_HOST: tried " in status
    assert "attempt 2: SUCCEEDED ZeRO-0 mb=4x2 (micro-batch 8 -> 4" in status
    assert "Re-planned after attempt 1: predicted peak per rank" in status


def test_a_sigkilled_rank_is_killed_not_escalated(stack: Stack, api: Api, token: str) -> None:
    stack.start_worker("w1")
    job = api.submit(tiny_spec(name="victim", steps=200))
    attempt_dir = _wait_for_step(api, job["id"], stack, step=2)
    # Rank 0 fails at once on its lost peer (gloo: "Connection closed by peer") and, when the
    # launcher polls it first, the launcher exits with rank 0's 1 and the run reads USER_ERROR
    # (1 of 5 CI runs). Held still, rank 0 cannot win that race, so this checks the path where
    # the launcher sees the SIGKILL; the race itself is a known gap (docs/escalation.md).
    os.kill(_rank_pid(attempt_dir, rank=0), signal.SIGSTOP)
    os.kill(_rank_pid(attempt_dir, rank=1), signal.SIGKILL)

    done = api.wait_for(job["id"], {"SUCCEEDED", "FAILED"}, stack)
    assert (done["status"], done["failure_class"]) == ("FAILED", "KILLED")
    assert done["message"] == "KILLED: killed by SIGKILL (exit code 247)"
    (attempt,) = done["attempts"]
    assert attempt["failure_evidence"]["lines"][1].endswith("exits with return code = -9")
    assert "ESCALATING" not in {e["to_status"] for e in done["events"]}
    status = zeropilot_status(stack, token, job["id"])
    print(status)  # docs/escalation.md shows a run of this
    assert "failure: KILLED: killed by SIGKILL (exit code 247)" in status
    assert "ended: KILLED: killed by SIGKILL (exit code 247)" in status


def zeropilot_status(stack: Stack, token: str, job_id: str) -> str:
    env = {**os.environ, "ZEROPILOT_URL": stack.url, "ZEROPILOT_TOKEN": token}
    argv = [sys.executable, "-m", "zeropilot.cli", "status", job_id]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def _wait_for_step(api: Api, job_id: str, stack: Stack, step: int) -> Path:
    deadline = time.monotonic() + 420
    while time.monotonic() < deadline:
        job = api.job(job_id)
        if any(m["step"] >= step for m in job["metrics"]):
            return Path(job["attempts"][0]["backend_ref"])
        assert job["status"] not in {"SUCCEEDED", "FAILED"}, job["message"]
        time.sleep(0.5)
    raise AssertionError(f"no step {step}:\n{stack.logs()}")


def _rank_pid(attempt_dir: Path, rank: int) -> int:
    """The training process of one rank: a python in the launcher's process group."""
    (group,) = [int(pid) for pid in (attempt_dir / "nodes.json").read_text().strip("[]").split(",")]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[2]) == group and f"--local_rank={rank}".encode() in argv:
            return int(proc.name)
    raise AssertionError(f"no rank {rank} in process group {group}")
