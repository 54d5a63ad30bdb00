"""The Slurm backend against a real Slurm: train, retry a submit, cancel, fail, run out of memory.

Each test launches real jobs through ``workers.backends.slurm`` on the local cluster that
``deploy/slurm/local-cluster.sh`` starts (two nodes in network namespaces), and checks what a
user would: the final state, the exit code, the failure class, the checkpoint, the processes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from service.core.clusters import ClusterProfile
from service.core.failures import FailureClass
from workers.backends import slurm
from workers.backends.base import BackendState, LaunchRequest, PermanentError
from workers.backends.shm import PREFIX, SHM_DIR
from workers.backends.slurm_commands import parse_fields

from .slurm_fixtures import (
    MEMORY_HOG_SCRIPT,
    NODE_ADDRESSES,
    PROBE_SCRIPT,
    LocalSlurm,
    launch_request,
    slurm_profile,
    wait_for,
    write_script,
)

# The session fixture ``slurm_cluster`` comes from slurm_fixtures, a plugin of tests/conftest.py.
RUNNING = frozenset({BackendState.RUNNING})
TIME_LIMIT_S = 60  # Slurm's shortest: --time counts whole minutes


@pytest.fixture(scope="module", autouse=True)
def time_limited_job(
    slurm_cluster: LocalSlurm, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    """Submitted before the other tests run, so that its minute passes while they do."""
    folder = tmp_path_factory.mktemp("time-limited")
    profile = slurm_profile(slurm_cluster, cpus_per_node=1, cpu_memory_gib=2)
    request = sleeping_probe(folder, profile, name="time-limited-a1", time_limit_s=TIME_LIMIT_S)
    return slurm.submit(request), folder


def sleeping_probe(
    folder: Path, profile: ClusterProfile, *, name: str, nodes: int = 1, **changes: Any
) -> LaunchRequest:
    """A job that starts like a training (launcher, process group) and then only waits."""
    probe = write_script(folder, "probe.py", PROBE_SCRIPT)
    return launch_request(
        folder, profile, name=name, entrypoint=probe, nodes=nodes, procs_per_node=1,
        env={"PROBE_DIR": str(folder), "PROBE_SLEEP_S": "600"}, **changes,
    )  # fmt: skip


def test_tiny_deepspeed_job_trains_to_succeeded_with_a_checkpoint(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    profile = slurm_profile(slurm_cluster)
    request = launch_request(
        tmp_path, profile, name="tiny-gpt-a1", entrypoint="examples/train_tiny.py",
        args=("--steps", "10"),
    )  # fmt: skip

    ref = slurm.submit(request)
    status = wait_for(profile, ref)

    assert (status.state, status.exit_code, status.native_state) == (
        BackendState.SUCCEEDED, 0, "COMPLETED",
    )  # fmt: skip
    assert "step 10 loss" in status.log_tail
    checkpoint = tmp_path / "checkpoints"
    assert (checkpoint / "latest").read_text() == "global_step10"
    assert (checkpoint / "global_step10").is_dir()
    port = re.search(r"master \S+:(\d+)", slurm.logs(profile, ref))
    assert port is not None  # DeepSpeed's CPU all-reduce buffers of that world are gone:
    assert not list(SHM_DIR.glob(f"{PREFIX}_{os.getuid()}_*_{port[1]}_*"))


def test_submitting_the_same_attempt_twice_starts_one_job(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    profile = slurm_profile(slurm_cluster)
    request = sleeping_probe(tmp_path, profile, name="retried-a1")

    first = slurm.submit(request)
    again = slurm.submit(request)
    (request.attempt_dir / slurm.JOB_ID_FILE).unlink()  # as if the worker died before noting it
    after_crash = slurm.submit(request)

    try:
        assert first == again == after_crash
        jobs = slurm_cluster.command("squeue", "--noheader", "--name=retried-a1", "--format=%i")
        assert jobs.split() == [first.partition(":")[0]]
    finally:
        slurm.cancel(profile, first, grace_s=0)


def test_cancel_stops_every_process_of_a_running_job(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    profile = slurm_profile(slurm_cluster)
    request = sleeping_probe(tmp_path, profile, name="cancelled-a1")
    ref = slurm.submit(request)
    wait_for(profile, ref, until=RUNNING, file_exists=tmp_path / "probe.json")

    slurm.cancel(profile, ref, grace_s=0)  # no grace: scancel at once (the grace's own tests:
    status = wait_for(profile, ref)  # test_slurm_graceful_stop.py)

    assert (status.state, status.native_state) == (BackendState.CANCELLED, "CANCELLED")
    assert status.failure_class() == FailureClass.CANCELLED
    leftovers = subprocess.run(
        ["pgrep", "-f", str(request.ds_config_path)], capture_output=True, text=True
    )
    assert leftovers.stdout == ""
    slurm.cancel(profile, ref)  # cancelling an ended job is a no-op


def test_failing_command_is_failed_with_its_exit_code(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    profile = slurm_profile(slurm_cluster)
    probe = write_script(tmp_path, "probe.py", PROBE_SCRIPT)
    request = launch_request(
        tmp_path, profile, name="failing-a1", entrypoint=probe,
        env={"PROBE_DIR": str(tmp_path), "PROBE_EXIT_CODE": "3"},
    )  # fmt: skip

    status = wait_for(profile, slurm.submit(request))

    assert (status.state, status.exit_code, status.native_state) == (
        BackendState.FAILED, 3, "FAILED",
    )  # fmt: skip
    assert status.node_exit_codes == {0: 3}
    assert status.failure_class() == FailureClass.USER_ERROR


def test_job_over_its_memory_limit_is_killed_and_classified_host_oom(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    profile = slurm_profile(slurm_cluster, cpu_memory_gib=1.5)  # --mem=1536M, cgroup-enforced
    hog = write_script(tmp_path, "hog.py", MEMORY_HOG_SCRIPT)
    request = launch_request(tmp_path, profile, name="hog-a1", entrypoint=hog, procs_per_node=1)

    status = wait_for(profile, slurm.submit(request))

    assert status.state == BackendState.FAILED
    assert "oom-kill in step" in status.reason
    assert "the memory limit was not enforced" not in status.log_tail
    assert status.failure_class() == FailureClass.OOM_HOST


def test_allocator_failure_is_classified_gpu_oom(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    profile = slurm_profile(slurm_cluster)
    request = launch_request(
        tmp_path, profile, name="allocator-a1", entrypoint="examples/train_tiny.py",
        args=("--steps", "10", "--oom-at-step", "2"),
    )  # fmt: skip

    status = wait_for(profile, slurm.submit(request))

    assert status.state == BackendState.FAILED
    assert "ZEROPILOT_FAILURE_CLASS=OOM_GPU" in status.log_tail
    assert status.failure_class() == FailureClass.OOM_GPU


EVIL_VALUES = (
    "it's",
    'say "hi"',
    "$(touch {marker})",
    "`touch {marker}`",
    "a; touch {marker}",
    "first line\nsecond line",
    "$HOME ${{PATH}} %j",
    "*",
    "",
)


def test_arguments_and_env_reach_the_training_process_literally(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    profile = slurm_profile(slurm_cluster)
    marker = tmp_path / "injected"
    evil = [value.format(marker=marker) for value in EVIL_VALUES]
    probe = write_script(tmp_path, "probe.py", PROBE_SCRIPT)
    request = launch_request(
        tmp_path, profile, name="quoting-a1", entrypoint=probe, procs_per_node=1,
        args=tuple(evil),
        env={"PROBE_DIR": str(tmp_path), **{f"EVIL_{i}": v for i, v in enumerate(evil)}},
    )  # fmt: skip

    status = wait_for(profile, slurm.submit(request))

    assert status.state == BackendState.SUCCEEDED, status.log_tail
    [seen] = json.loads((tmp_path / "probe.json").read_text())
    # DeepSpeed's launcher adds --local_rank first; everything else arrives untouched.
    assert seen["argv"] == [
        "--local_rank=0",
        *evil,
        "--deepspeed_config",
        str(request.ds_config_path),
    ]
    assert seen["env"] == {
        **{f"EVIL_{i}": v for i, v in enumerate(evil)},
        "NCCL_DEBUG": "WARN",
        "NCCL_IB_DISABLE": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    assert not marker.exists()


def test_unsafe_job_name_is_rejected_before_anything_reaches_slurm(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    profile = slurm_profile(slurm_cluster)
    request = launch_request(
        tmp_path, profile, name="x;scancel -u root", entrypoint="examples/train_tiny.py"
    )

    with pytest.raises(PermanentError):
        slurm.submit(request)
    assert not (request.attempt_dir / slurm.JOB_ID_FILE).exists()


FORGOTTEN_JOB_ID = "4000001"  # far above any id the local cluster has handed out


@pytest.mark.parametrize(
    ("left_behind", "expected", "exit_code"),
    [
        ({"slurm-4000001.exit": "0\n"}, BackendState.SUCCEEDED, 0),
        ({"slurm-4000001.exit": "3\n"}, BackendState.FAILED, 3),
        ({slurm.CANCEL_MARKER: ""}, BackendState.CANCELLED, None),
        ({}, BackendState.LOST, None),
    ],
)
def test_job_slurm_has_forgotten_is_read_from_what_it_left_in_the_folder(
    slurm_cluster: LocalSlurm,
    tmp_path: Path,
    left_behind: dict[str, str],
    expected: BackendState,
    exit_code: int | None,
) -> None:
    profile = slurm_profile(slurm_cluster)
    for name, text in left_behind.items():
        (tmp_path / name).write_text(text)
    ref = slurm.encode_ref(FORGOTTEN_JOB_ID, tmp_path)

    status = slurm.poll(profile, ref)  # scontrol: "Invalid job id"; sacct: no accounting here

    assert (status.state, status.exit_code) == (expected, exit_code)
    slurm.cancel(profile, ref)  # nothing left to stop: a no-op


def test_two_node_job_crosses_namespaced_addresses(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    profile = slurm_profile(slurm_cluster, cpus_per_node=1)
    probe = write_script(tmp_path, "probe.py", PROBE_SCRIPT)
    request = launch_request(
        tmp_path, profile, name="two-nodes-a1", entrypoint=probe, nodes=2, procs_per_node=1,
        env={"PROBE_DIR": str(tmp_path)},
    )  # fmt: skip

    status = wait_for(profile, slurm.submit(request))

    assert status.state == BackendState.SUCCEEDED, status.log_tail
    ranks = json.loads((tmp_path / "probe.json").read_text())
    placed = {(rank["rank"], rank["hostname"], rank["address"]) for rank in ranks}
    assert placed == {
        (0, "zp-node1", NODE_ADDRESSES["zp-node1"]),
        (1, "zp-node2", NODE_ADDRESSES["zp-node2"]),
    }
    assert f"master {NODE_ADDRESSES['zp-node1']}:" in status.log_tail


def test_tiny_deepspeed_job_trains_across_two_nodes(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    profile = slurm_profile(slurm_cluster, cpus_per_node=1)
    request = launch_request(
        tmp_path, profile, name="tiny-gpt-2n-a1", entrypoint="examples/train_tiny.py",
        args=("--steps", "10"), nodes=2, procs_per_node=1,
    )  # fmt: skip

    ref = slurm.submit(request)
    status = wait_for(profile, ref)

    assert status.state == BackendState.SUCCEEDED, status.log_tail
    assert "nnodes=2, num_local_procs=1, node_rank=1" in slurm.logs(profile, ref)
    assert (tmp_path / "checkpoints" / "global_step10").is_dir()


def test_node_failure_is_reported_as_node_lost(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    profile = slurm_profile(slurm_cluster, cpus_per_node=2)  # a node the time-limited job left
    request = sleeping_probe(tmp_path, profile, name="node-lost-a1")
    ref = slurm.submit(request)
    wait_for(profile, ref, until=RUNNING, file_exists=tmp_path / "probe.json")
    job = parse_fields(slurm_cluster.command("scontrol", "show", "job", "-o", ref.split(":")[0]))

    node = job["NodeList"]
    slurm_cluster.command("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=test")
    try:
        status = wait_for(profile, ref)
    finally:
        slurm_cluster.wait_until_up()  # the node's slurmd still answers: it comes back

    assert (status.state, status.native_state) == (BackendState.FAILED, "NODE_FAIL")
    assert status.failure_class() == FailureClass.NODE_LOST


def test_time_limit_warns_the_training_then_ends_as_timeout(
    slurm_cluster: LocalSlurm, time_limited_job: tuple[str, Path]
) -> None:
    ref, folder = time_limited_job
    profile = slurm_profile(slurm_cluster)

    status = wait_for(profile, ref, deadline_s=TIME_LIMIT_S + 240)

    assert (status.state, status.native_state) == (BackendState.FAILED, "TIMEOUT")
    assert status.failure_class() == FailureClass.TIMEOUT
    # USR1 came before the limit; the training got it and the launchers ignored it.
    assert (folder / "usr1-0").exists()
