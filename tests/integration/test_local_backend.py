"""The local backend with real DeepSpeed: multi-node launch, failure, cancel, idempotency."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from service.core.clusters import LOCAL_PROFILE
from tests.integration.helpers import REPO
from workers.backends import local
from workers.backends.base import BackendState, BackendStatus, LaunchRequest

pytestmark = pytest.mark.slow

DS_CONFIG = {
    "train_batch_size": 8,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "torch_adam": True}},
    "zero_optimization": {"stage": 2},
    "steps_per_print": 1000,
}


def request(tmp_path: Path, *args: str, nodes: int = 1, procs: int = 2) -> LaunchRequest:
    attempt_dir = tmp_path / "attempt"
    attempt_dir.mkdir(exist_ok=True)
    ds_config = attempt_dir / "ds_config.json"
    ds_config.write_text(json.dumps({**DS_CONFIG, "train_batch_size": 4 * nodes * procs}))
    return LaunchRequest(
        name="zp-test-0000-a1",
        attempt_dir=attempt_dir,
        nodes=nodes,
        procs_per_node=procs,
        entrypoint="train_tiny.py",
        args=args,
        ds_config_path=ds_config,
        env={"ZEROPILOT_CHECKPOINT_DIR": str(tmp_path / "ckpt")},
        working_dir=REPO / "examples",
        profile=LOCAL_PROFILE,
        python=sys.executable,
    )


def wait_until(ref: str, done: set[BackendState], timeout_s: float = 300) -> BackendStatus:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = local.poll(LOCAL_PROFILE, ref)
        if status.state in done:
            return status
        time.sleep(0.5)
    raise AssertionError(f"still {status.state}:\n{local.logs(LOCAL_PROFILE, ref)}")


def test_two_nodes_on_one_machine_form_one_world(tmp_path: Path) -> None:
    ref = local.submit(request(tmp_path, "--steps", "4", nodes=2, procs=1))
    status = wait_until(ref, {BackendState.SUCCEEDED, BackendState.FAILED})
    assert status.state == BackendState.SUCCEEDED, local.logs(LOCAL_PROFILE, ref)
    assert status.node_exit_codes == {0: 0, 1: 0}
    logs = local.logs(LOCAL_PROFILE, ref)
    assert "nnodes=2, num_local_procs=1, node_rank=1" in logs
    assert "dist_world_size=2" in logs
    assert (tmp_path / "ckpt" / "global_step4").is_dir()


def test_failing_training_is_failed_with_its_exit_code(tmp_path: Path) -> None:
    ref = local.submit(request(tmp_path, "--steps", "5", "--fail-at-step", "2"))
    status = wait_until(ref, {BackendState.SUCCEEDED, BackendState.FAILED})
    assert status.state == BackendState.FAILED
    assert status.exit_code == 3
    assert "step 1 loss" in status.log_tail


def test_cancel_stops_every_process_and_submit_is_idempotent(tmp_path: Path) -> None:
    launch = request(tmp_path, "--steps", "100000")
    ref = local.submit(launch)
    assert local.submit(launch) == ref
    log = Path(ref) / "node-0.log"
    deadline = time.monotonic() + 300
    while "step 2 loss" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, local.logs(LOCAL_PROFILE, ref)
        time.sleep(0.5)
    assert local.poll(LOCAL_PROFILE, ref).state == BackendState.RUNNING
    assert log.read_text().count("dist_world_size=2") == 1  # two submits, one launch
    groups = json.loads((Path(ref) / "nodes.json").read_text())

    local.cancel(LOCAL_PROFILE, ref)
    status = wait_until(ref, {BackendState.CANCELLED, BackendState.FAILED, BackendState.SUCCEEDED})
    assert status.state == BackendState.CANCELLED
    for group in groups:
        with pytest.raises(ProcessLookupError):
            os.killpg(group, 0)  # nothing of the launcher or its ranks is left
    assert local.submit(launch) == ref  # a late retry does not start it again
    time.sleep(1)
    assert local.poll(LOCAL_PROFILE, ref).state == BackendState.CANCELLED


def test_missing_entrypoint_is_a_permanent_error(tmp_path: Path) -> None:
    from workers.backends.base import PermanentError

    bad = request(tmp_path)
    bad = LaunchRequest(**{**bad.__dict__, "entrypoint": "no_such_script.py"})
    with pytest.raises(PermanentError, match=r"no_such_script\.py"):
        local.submit(bad)


def test_a_missing_working_dir_is_a_permanent_error_naming_it(tmp_path: Path) -> None:
    from workers.backends.base import PermanentError

    gone = tmp_path / "deleted-checkout"
    script = REPO / "examples" / "train_tiny.py"  # absolute: found without the working_dir
    bad = request(tmp_path)
    bad = LaunchRequest(**{**bad.__dict__, "entrypoint": str(script), "working_dir": gone})
    with pytest.raises(PermanentError, match=f"working_dir '{gone}' is not a folder here"):
        local.submit(bad)
    assert not (bad.attempt_dir / "launch.json").exists()  # no supervisor to die in chdir
