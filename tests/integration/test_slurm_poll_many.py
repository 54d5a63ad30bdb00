"""``poll_many`` on a real Slurm: attempts in every state, polled in one pass, read as polling
each alone reads them, with one ``squeue`` and one ``sacct`` whatever their number.

The jobs are real ones on the local cluster (deploy/slurm/local-cluster.sh): one held, one
sleeping, one that exits 0, one that exits 3, one killed by its memory limit, one cancelled, and
one Slurm has never heard of (deleted outside zeropilot and forgotten: no files either).
"""

from __future__ import annotations

from pathlib import Path

from service.core.failures import FailureClass
from workers.backends import slurm
from workers.backends.base import BackendState, BackendStatus
from workers.backends.calls import calls_sent

from .slurm_fixtures import (
    MEMORY_HOG_SCRIPT,
    PROBE_SCRIPT,
    LocalSlurm,
    launch_request,
    slurm_profile,
    wait_for,
    write_script,
)

RUNNING = frozenset({BackendState.RUNNING})
FORGOTTEN_JOB_ID = "4000002"  # far above any id the local cluster has handed out


def probe(slurm_cluster: LocalSlurm, folder: Path, name: str, sleep_s: str, code: str) -> str:
    folder.mkdir()
    profile = slurm_profile(slurm_cluster, cpus_per_node=1, cpu_memory_gib=1)
    script = write_script(folder, "probe.py", PROBE_SCRIPT)
    env = {"PROBE_DIR": str(folder), "PROBE_SLEEP_S": sleep_s, "PROBE_EXIT_CODE": code}
    request = launch_request(folder, profile, name=name, entrypoint=script, procs_per_node=1,
                             env=env)  # fmt: skip
    return slurm.submit(request)


def held_job(slurm_cluster: LocalSlurm, folder: Path) -> str:
    """``sbatch --hold``: pending until released, whatever the cluster has free."""
    folder.mkdir()
    answer = slurm_cluster.command("sbatch", "--hold", "--parsable", f"--chdir={folder}",
                                   "--job-name=mixed-held-a1", "--wrap=true")  # fmt: skip
    return slurm.encode_ref(answer.strip().split(";")[0], folder)


def without_log(status: BackendStatus) -> tuple[object, ...]:
    return (status.state, status.exit_code, status.native_state, status.reason,
            status.node_exit_codes)  # fmt: skip


def test_one_pass_over_jobs_in_mixed_states_matches_polling_each_alone(
    slurm_cluster: LocalSlurm, tmp_path: Path
) -> None:
    profile = slurm_profile(slurm_cluster)
    refs = {
        "pending": held_job(slurm_cluster, tmp_path / "held"),
        "running": probe(slurm_cluster, tmp_path / "running", "mixed-running-a1", "600", "0"),
        "succeeded": probe(slurm_cluster, tmp_path / "succeeded", "mixed-ok-a1", "0", "0"),
        "failed": probe(slurm_cluster, tmp_path / "failed", "mixed-failed-a1", "0", "3"),
        "cancelled": probe(slurm_cluster, tmp_path / "cancelled", "mixed-cancel-a1", "600", "0"),
    }
    hog_profile = slurm_profile(slurm_cluster, cpu_memory_gib=1.5)  # cgroup-enforced --mem
    hog = write_script(tmp_path, "hog.py", MEMORY_HOG_SCRIPT)
    hog_request = launch_request(tmp_path, hog_profile, name="mixed-hog-a1", entrypoint=hog,
                                 procs_per_node=1)  # fmt: skip
    refs["oom"] = slurm.submit(hog_request)
    (tmp_path / "gone").mkdir()
    refs["gone"] = slurm.encode_ref(FORGOTTEN_JOB_ID, tmp_path / "gone")
    try:
        wait_for(profile, refs["cancelled"], until=RUNNING)
        slurm.cancel(profile, refs["cancelled"], grace_s=0)  # scancel at once, no SIGTERM first
        for what in ("succeeded", "failed", "oom", "cancelled"):
            wait_for(profile, refs[what])
        wait_for(profile, refs["running"], until=RUNNING)

        before = calls_sent("slurm")
        together = slurm.poll_many(profile, list(refs.values()))
        calls = calls_sent("slurm") - before
        alone = {ref: slurm.poll(profile, ref) for ref in refs.values()}
    finally:
        for what in ("pending", "running"):
            slurm.cancel(profile, refs[what], grace_s=0)

    states = {what: together[ref].state for what, ref in refs.items()}
    assert states == {
        "pending": BackendState.PENDING, "running": BackendState.RUNNING,
        "succeeded": BackendState.SUCCEEDED, "failed": BackendState.FAILED,
        "oom": BackendState.FAILED, "cancelled": BackendState.CANCELLED,
        "gone": BackendState.LOST,
    }  # fmt: skip
    assert {r: without_log(s) for r, s in together.items()} == {
        r: without_log(s) for r, s in alone.items()
    }
    for what in ("succeeded", "failed", "oom", "cancelled", "gone"):  # ended: their log read
        assert together[refs[what]].log_tail == alone[refs[what]].log_tail
    assert together[refs["pending"]].reason == "JobHeldUser"
    assert together[refs["oom"]].failure_class() == FailureClass.OOM_HOST
    assert together[refs["failed"]].exit_code == 3
    # One squeue for the seven; one sacct for the one it does not show.
    assert calls == 2
