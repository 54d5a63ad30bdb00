"""The sbatch and node scripts the Slurm backend renders, checked without a Slurm cluster.

The node script is run by a real bash with a stand-in interpreter that records its argv and
environment, so the quoting is proven by execution, not by reading the text.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from service.core.clusters import BackendKind, ClusterProfile
from workers.backends.base import LaunchRequest, PermanentError, TemporaryError
from workers.backends.slurm import decode_ref, encode_ref
from workers.backends.slurm_commands import (
    UnknownJobError,
    parse_exit_code,
    parse_fields,
    parse_sacct,
    run_slurm,
)
from workers.backends.slurm_render import (
    render_batch_script,
    render_node_script,
    sbatch_options,
    signal_lead_s,
)

EVIL = [
    "it's",
    'say "hi"',
    "$(touch {marker})",
    "`touch {marker}`",
    "a; touch {marker}",
    "line one\nline two",
    "$HOME and ${{PATH}}",
    "*",
    "--flag=%j %N",
    "",
]


def profile(**changes: object) -> ClusterProfile:
    fields = {"name": "hpc", "kind": BackendKind.SLURM, "cpu_memory_gib": 2.5, **changes}
    return ClusterProfile.model_validate(fields)


def request(tmp_path: Path, **changes: object) -> LaunchRequest:
    base = LaunchRequest(
        name="tiny-gpt-a1",
        attempt_dir=tmp_path / "attempt",
        nodes=2,
        procs_per_node=4,
        entrypoint="train.py",
        args=("--steps", "10"),
        ds_config_path=tmp_path / "attempt" / "ds_config.json",
        env={"ZEROPILOT_ATTEMPT_ID": "a1"},
        working_dir=tmp_path,
        profile=profile(),
        time_limit_s=3600,
        python="/opt/venv/bin/python",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_directives_ask_for_what_the_job_needs(tmp_path: Path) -> None:
    options = sbatch_options(
        request(tmp_path, profile=profile(partition="gpu", account="ml", qos="high"))
    )
    attempt = tmp_path / "attempt"
    assert options == [
        "--job-name=tiny-gpt-a1",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=4",
        "--mem=2560M",
        f"--output={attempt}/slurm-%j.log",
        f"--error={attempt}/slurm-%j.log",
        "--no-requeue",
        "--open-mode=append",
        "--signal=USR1@300",
        "--time=60",
        "--partition=gpu",
        "--account=ml",
        "--qos=high",
    ]


def test_gpus_are_requested_only_for_gpu_profiles(tmp_path: Path) -> None:
    gpu = profile(accelerator="nvidia-h100-80gb", cpus_per_node=32)
    gpu_options = sbatch_options(request(tmp_path, profile=gpu))
    assert "--gpus-per-node=4" in gpu_options
    assert "--cpus-per-task=32" in gpu_options
    assert not any(o.startswith("--gpus") for o in sbatch_options(request(tmp_path)))


def test_time_limit_rounds_up_to_whole_minutes_and_warns_ahead(tmp_path: Path) -> None:
    options = sbatch_options(request(tmp_path, time_limit_s=61))
    assert "--time=2" in options
    assert "--signal=USR1@10" in options
    assert signal_lead_s(None) == 300
    assert signal_lead_s(7200) == 300


@pytest.mark.parametrize(
    "changes",
    [
        {"name": "x\n#SBATCH --uid=0"},
        {"name": "Upper_Case"},
        {"profile": profile(partition="gpu --exclusive")},
        {"profile": profile(account="ml\n#SBATCH --nodelist=evil")},
        {"attempt_dir": Path("/tmp/has space/attempt")},
        {"attempt_dir": Path("/tmp/100%/attempt")},
        {"args": ("nul\0byte",)},
        {"env": {"BAD NAME": "x"}},
        {"profile": profile(master_port_range=(29800, 29700))},
    ],
)
def test_values_sbatch_or_a_shell_would_misread_are_rejected(
    tmp_path: Path, changes: dict[str, object]
) -> None:
    with pytest.raises(PermanentError):
        bad = request(tmp_path, **changes)
        render_batch_script(bad)
        render_node_script(bad)


def test_batch_script_is_valid_bash(tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(render_batch_script(request(tmp_path)))
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert 'srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=4 bash "$attempt_dir"' in (
        script.read_text()
    )


def test_node_script_passes_arguments_and_env_through_literally(tmp_path: Path) -> None:
    marker = tmp_path / "injected"
    evil = [value.format(marker=marker) for value in EVIL]
    recorded = tmp_path / "argv.json"
    fake_python = tmp_path / "fake-python"
    fake_python.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ), 'cwd': os.getcwd()}}, "
        f"open({str(recorded)!r}, 'w'))\n"
    )
    fake_python.chmod(0o755)
    launch = request(
        tmp_path,
        python=str(fake_python),
        args=tuple(evil),
        env={f"EVIL_{i}": value for i, value in enumerate(evil)},
        profile=profile(nccl_env={"NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN"}),
    )
    node_script = tmp_path / "node.sh"
    node_script.write_text(render_node_script(launch))
    runtime = {
        "SLURM_NODEID": "1",
        "ZEROPILOT_HOSTFILE": "/shared/hostfile",
        "ZEROPILOT_MASTER_ADDR": "10.0.0.7",
        "ZEROPILOT_MASTER_PORT": "29712",
    }
    subprocess.run(["bash", str(node_script)], check=True, env={**os.environ, **runtime})

    seen = json.loads(recorded.read_text())
    assert seen["argv"] == [
        "-m", "deepspeed.launcher.runner", "--no_ssh",
        "--hostfile", "/shared/hostfile",
        "--node_rank", "1",
        "--master_addr", "10.0.0.7",
        "--master_port", "29712",
        "train.py", *evil,
        "--deepspeed_config", str(launch.ds_config_path),
    ]  # fmt: skip
    assert {k: seen["env"][k] for k in launch.env} == launch.env
    assert seen["env"]["NCCL_SOCKET_IFNAME"] == "eth0"
    assert seen["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert seen["cwd"] == str(tmp_path)
    assert not marker.exists()


def test_job_env_overrides_profile_which_overrides_defaults(tmp_path: Path) -> None:
    launch = request(
        tmp_path,
        profile=profile(nccl_env={"NCCL_DEBUG": "INFO", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}),
        env={"NCCL_DEBUG": "WARN"},
    )
    script = render_node_script(launch)
    assert "export NCCL_DEBUG=WARN\n" in script
    assert "export TORCH_NCCL_ASYNC_ERROR_HANDLING=0\n" in script


def test_scontrol_line_fields() -> None:
    line = (
        "JobId=42 JobName=tiny-gpt-a1 UserId=root(0) JobState=PENDING Reason=Priority "
        "Dependency=(null) ExitCode=0:0 TRES=cpu=4,mem=2560M,node=2 WorkDir=/a b JobState=X"
    )
    fields = parse_fields(line)
    assert fields["JobState"] == "PENDING"
    assert fields["Reason"] == "Priority"
    assert fields["TRES"] == "cpu=4,mem=2560M,node=2"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0:0", 0), ("3:0", 3), ("0:9", 137), ("0:15", 143), ("0:125", None), ("", None)],
)
def test_exit_codes_read_like_a_shell_reports_them(text: str, expected: int | None) -> None:
    assert parse_exit_code(text) == expected


def test_sacct_reports_a_step_out_of_memory_on_the_job() -> None:
    text = "42|FAILED|1:0|None\n42.batch|FAILED|1:0|\n42.0|OUT_OF_MEMORY|0:125|\n"
    assert parse_sacct(text) == {"JobState": "OUT_OF_MEMORY", "ExitCode": "1:0", "Reason": "None"}
    assert parse_sacct("43|CANCELLED by 0|0:15|None\n")["JobState"] == "CANCELLED"  # type: ignore[index]
    assert parse_sacct("") is None


def test_reference_round_trips_and_rejects_foreign_refs(tmp_path: Path) -> None:
    assert decode_ref(encode_ref("42", tmp_path)) == ("42", tmp_path)
    with pytest.raises(PermanentError):
        decode_ref("/tmp/some/local/attempt")


def test_node_script_passes_slurms_warning_signal_to_the_training_and_keeps_its_exit_code(
    tmp_path: Path,
) -> None:
    ready, warned = tmp_path / "ready", tmp_path / "warned"
    fake_python = tmp_path / "fake-python"  # stands in for launcher and training at once
    fake_python.write_text(
        f"#!{sys.executable}\nimport pathlib, signal, sys, time\n"
        f"signal.signal(signal.SIGUSR1, lambda *_: (pathlib.Path({str(warned)!r}).touch(), "
        f"sys.exit(7)))\npathlib.Path({str(ready)!r}).touch()\ntime.sleep(60)\n"
    )
    fake_python.chmod(0o755)
    node_script = tmp_path / "node.sh"
    node_script.write_text(render_node_script(request(tmp_path, python=str(fake_python))))
    runtime = {"SLURM_NODEID": "0", "ZEROPILOT_HOSTFILE": "h", "ZEROPILOT_MASTER_ADDR": "a"}
    node = subprocess.Popen(
        ["bash", str(node_script)], env={**os.environ, **runtime, "ZEROPILOT_MASTER_PORT": "1"}
    )
    while not ready.exists() and node.poll() is None:
        time.sleep(0.05)

    node.send_signal(signal.SIGUSR1)  # what slurmstepd does before the time limit

    assert node.wait(timeout=30) == 7
    assert warned.exists()


@pytest.mark.parametrize(
    ("stderr", "error"),
    [
        ("sbatch: error: Batch job submission failed: Invalid partition name specified",
         PermanentError),
        ("squeue: error: Unable to contact slurm controller (connect failure)", TemporaryError),
        ("slurm_load_jobs error: Invalid job id specified", UnknownJobError),
    ],
)  # fmt: skip
def test_slurm_command_failures_become_backend_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stderr: str, error: type[Exception]
) -> None:
    fake = tmp_path / "sbatch"
    fake.write_text(f"#!/bin/sh\necho {shlex.quote(stderr)} >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(error) as raised:
        run_slurm(profile(), ["sbatch", "--parsable", "job.sbatch"])
    assert stderr in str(raised.value)
    assert isinstance(raised.value.__cause__, subprocess.CalledProcessError)


def test_missing_slurm_client_is_a_permanent_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PermanentError, match="sbatch not found"):
        run_slurm(profile(), ["sbatch", "job.sbatch"])


def test_a_slurm_conf_that_is_not_there_is_named_at_once(tmp_path: Path) -> None:
    missing = ClusterProfile(name="hpc", kind=BackendKind.SLURM, slurm_conf=str(tmp_path / "no"))
    # refused before squeue runs: Slurm's clients themselves retry a missing file for 60 s
    with pytest.raises(PermanentError, match=r"cluster hpc's slurm_conf .*/no is not a file here"):
        run_slurm(missing, ["squeue", "--me"])
