"""The graceful stop on a real Slurm: SIGTERM to the training, a save, ``scancel`` after the grace.

``slurm.cancel`` is called the way the reconcile pass calls it (``workers.reconcile.send_stop``),
once a second until the job has ended: the first call signals the steps, the calls within the
grace do nothing, the first one after it cancels the job.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from service.core.clusters import ClusterProfile
from service.core.failures import FailureClass
from workers.backends import slurm
from workers.backends.base import BackendState, BackendStatus
from workers.backends.calls import calls_sent

from .slurm_fixtures import LocalSlurm, launch_request, slurm_profile, wait_for, write_script

RUNNING = frozenset({BackendState.RUNNING})

# Through DeepSpeed's launcher like a training, but it only notes the SIGTERM and goes on: a
# heartbeat every 0.1 s says until when it lived.
STUBBORN_SCRIPT = """\
import os, signal, time
folder = os.environ["PROBE_DIR"]

def note(name):
    with open(os.path.join(folder, name + ".tmp"), "w") as out:
        out.write("%.3f" % time.time())
    os.replace(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))

def on_term(*_):
    with open(os.path.join(folder, "terms"), "a") as out:
        out.write("%.3f\\n" % time.time())

signal.signal(signal.SIGTERM, on_term)
while True:
    note("alive-at")
    time.sleep(0.1)
"""


def stop_like_the_reconcile(
    profile: ClusterProfile, ref: str, grace_s: float, deadline_s: float = 180
) -> tuple[BackendStatus, list[tuple[float, int]]]:
    """Cancel once a second until the job ended; its final status and, for each call that ran
    Slurm commands, the seconds since the first call and how many commands it ran."""
    give_up = time.monotonic() + deadline_s
    first: float | None = None
    sent = []
    while not (status := slurm.poll(profile, ref)).state.terminal:
        assert time.monotonic() < give_up, f"{ref} still {status} after {deadline_s} s"
        before, now = calls_sent("slurm"), time.monotonic()
        first = now if first is None else first
        slurm.cancel(profile, ref, grace_s)
        if commands := calls_sent("slurm") - before:
            sent.append((now - first, commands))
        time.sleep(1)
    return status, sent


def test_a_stopped_training_saves_the_step_it_reached_and_exits_75(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    profile = slurm_profile(slurm_cluster)
    request = launch_request(
        tmp_path, profile, name="graceful-a1", entrypoint="examples/train_tiny.py",
        args=("--steps", "100000", "--checkpoint-interval", "100000"),
    )  # fmt: skip
    ref = slurm.submit(request)
    log = Path(slurm.log_path(ref))
    while "step 3 loss" not in (log.read_text() if log.exists() else ""):
        assert slurm.poll(profile, ref).state in {BackendState.PENDING, BackendState.RUNNING}
        time.sleep(0.5)

    status, _ = stop_like_the_reconcile(profile, ref, grace_s=60)

    assert (status.state, status.exit_code, status.native_state) == (
        BackendState.FAILED, 75, "FAILED",
    )  # fmt: skip  # zeropilot.runtime.STOPPED_EXIT_CODE through launcher, srun and sbatch
    text = slurm.logs(profile, ref, 400)
    last_step = max(int(step) for step in re.findall(r"^step (\d+) loss", text, re.MULTILINE))
    checkpoints = tmp_path / "checkpoints"
    saved = (checkpoints / "latest").read_text()
    assert saved == f"global_step{last_step}"  # the step it reached, no interval checkpoint
    assert (checkpoints / saved).is_dir()
    assert "zeropilot: SIGTERM: saving at the end of this step" in text
    assert "Main process received SIGTERM" not in text  # the ranks were signalled, not launchers
    assert status.failure_class() == FailureClass.PREEMPTED  # the runtime's marker line
    assert slurm.term_sent_at(request.attempt_dir) is not None


def test_a_training_that_ignores_sigterm_is_killed_after_its_grace(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    profile = slurm_profile(slurm_cluster, cpus_per_node=1)
    script = write_script(tmp_path, "stubborn.py", STUBBORN_SCRIPT)
    request = launch_request(
        tmp_path, profile, name="stubborn-a1", entrypoint=script, procs_per_node=1,
        env={"PROBE_DIR": str(tmp_path)},
    )  # fmt: skip
    ref = slurm.submit(request)
    wait_for(profile, ref, until=RUNNING, file_exists=tmp_path / "alive-at")
    grace_s = 4.0

    status, sent = stop_like_the_reconcile(profile, ref, grace_s)

    # The stop's SIGTERM reached the training; so did scancel's own, after the grace.
    term_at, *later = (float(line) for line in (tmp_path / "terms").read_text().split())
    lived_after_term = float((tmp_path / "alive-at").read_text()) - term_at
    sent_at = slurm.term_sent_at(request.attempt_dir)
    assert sent_at is not None and 0 <= term_at - sent_at < 2
    assert lived_after_term >= grace_s - 0.2  # within one heartbeat of the grace, not before
    assert (status.state, status.native_state) == (BackendState.CANCELLED, "CANCELLED")
    assert status.failure_class() == FailureClass.CANCELLED
    assert later and later[0] - term_at >= grace_s
    # The first call: the job's state, then the signal; the calls within the grace sent
    # nothing; the first one after it, scancel; those after that, nothing.
    (signal_at, signal_commands), (kill_at, kill_commands) = sent
    assert (signal_at, signal_commands, kill_commands) == (0, 2, 1)
    assert grace_s <= kill_at < grace_s + 2
    print(f"lived {lived_after_term:.1f} s after the SIGTERM (grace {grace_s:g} s)")


def test_a_job_that_has_not_started_is_cancelled_at_once(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    answer = slurm_cluster.command("sbatch", "--hold", "--parsable", f"--chdir={tmp_path}",
                                   "--job-name=held-stop-a1", "--wrap=true")  # fmt: skip
    ref = slurm.encode_ref(answer.strip().split(";")[0], tmp_path)
    profile = slurm_profile(slurm_cluster)

    began = time.monotonic()
    slurm.cancel(profile, ref)  # the default 30 s grace: nothing runs, so nothing to wait for
    status = wait_for(profile, ref, deadline_s=30)

    assert time.monotonic() - began < 10  # scancel did not retry a signal it cannot deliver
    assert (status.state, status.native_state) == (BackendState.CANCELLED, "CANCELLED")
    assert slurm.term_sent_at(tmp_path) is None
