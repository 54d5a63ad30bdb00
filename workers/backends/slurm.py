"""The Slurm backend: one sbatch job per attempt, watched with scontrol, stopped with scancel.

The reference is ``"<slurm job id>:<absolute attempt folder>"``: the id to ask Slurm about, and
the folder (on storage the cluster shares) with the scripts, the log and the exit-code file. The
job is named after the attempt, so a retried ``submit`` finds the job it already started (the id
file in the folder, else ``squeue --name``) instead of starting a second one. Without accounting
Slurm forgets a finished job after MinJobAge; ``poll`` then reads the exit code the batch script
left in the folder. ``poll_many`` asks once for all the attempts of a cluster (one ``squeue``,
one ``sacct`` for the jobs it no longer shows) and reads log tails only of jobs that ended.
"""

from __future__ import annotations

import contextlib
import fcntl
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from service.contained_files import NotContained
from service.core.clusters import ClusterProfile
from service.core.stopping import DEFAULT_GRACE_S
from service.logtail import tail_lines as read_tail
from workers.backends.base import (
    BackendState,
    BackendStatus,
    LaunchRequest,
    PermanentError,
    TemporaryError,
)
from workers.backends.slurm_commands import (
    SQUEUE_FORMAT,
    UnknownJobError,
    parse_exit_code,
    parse_fields,
    parse_sacct,
    parse_sacct_jobs,
    parse_squeue,
    run_slurm,
)
from workers.backends.slurm_render import (
    BATCH_SCRIPT,
    NODE_SCRIPT,
    exit_code_file,
    log_file,
    render_batch_script,
    render_node_script,
)
from workers.render import make_private_dir, write_private

JOB_ID_FILE = "slurm_job_id"
CANCEL_MARKER = "slurm_cancel_requested"
# When the stop's SIGTERM went out, and when the scancel after its grace did (Unix times).
TERM_MARKER = "slurm_term_sent"
KILL_MARKER = "slurm_scancel_sent"
POLL_TAIL_LINES = 80

_STATES = {
    "PENDING": BackendState.PENDING,
    "CONFIGURING": BackendState.PENDING,
    "REQUEUED": BackendState.PENDING,  # it will run again
    "REQUEUE_HOLD": BackendState.PENDING,
    "REQUEUE_FED": BackendState.PENDING,
    "RESV_DEL_HOLD": BackendState.PENDING,
    "SUSPENDED": BackendState.PENDING,
    "RUNNING": BackendState.RUNNING,
    "COMPLETING": BackendState.RUNNING,  # processes ended, the nodes are still cleaning up
    "SIGNALING": BackendState.RUNNING,
    "STAGE_OUT": BackendState.RUNNING,
    "RESIZING": BackendState.RUNNING,
    "COMPLETED": BackendState.SUCCEEDED,
    "CANCELLED": BackendState.CANCELLED,
    "FAILED": BackendState.FAILED,
    "TIMEOUT": BackendState.FAILED,
    "NODE_FAIL": BackendState.FAILED,
    "PREEMPTED": BackendState.FAILED,
    "OUT_OF_MEMORY": BackendState.FAILED,
    "BOOT_FAIL": BackendState.FAILED,
    "DEADLINE": BackendState.FAILED,
    "REVOKED": BackendState.FAILED,
    "SPECIAL_EXIT": BackendState.FAILED,
}
_STEP_OOM = re.compile(r"Detected \d+ oom[-_]kill event\(s\) in StepId=(\S+?)\.? ")
_TASK_EXIT = re.compile(r"srun: error: \S+: tasks? (\d+)(?:-(\d+))?: Exited with exit code (\d+)")


def submit(request: LaunchRequest) -> str:
    batch_script, node_script = render_batch_script(request), render_node_script(request)
    attempt_dir = make_private_dir(request.attempt_dir.absolute())
    with _submit_lock(attempt_dir):  # two workers retrying one launch submit once
        job_id = _existing_job(request, attempt_dir)
        if job_id is None:
            write_private(attempt_dir / NODE_SCRIPT, node_script)  # it exports the token
            write_private(attempt_dir / BATCH_SCRIPT, batch_script)
            job_id = _sbatch(request.profile, attempt_dir)
    return encode_ref(job_id, attempt_dir)


def poll(profile: ClusterProfile, ref: str) -> BackendStatus:
    job_id, attempt_dir = decode_ref(ref)
    fields = _scontrol_job(profile, job_id) or _sacct_job(profile, job_id)
    if fields is None:
        return _status_from_files(job_id, attempt_dir)
    native_state = fields.get("JobState", "UNKNOWN")
    state = _STATES.get(native_state, BackendState.RUNNING)  # an unknown word is not an ending
    log_tail = _log_tail(attempt_dir, job_id, POLL_TAIL_LINES)
    return BackendStatus(
        state,
        exit_code=parse_exit_code(fields.get("ExitCode", "")) if state.terminal else None,
        native_state=native_state,
        reason=_reason(fields.get("Reason", ""), log_tail),
        log_tail=log_tail,
        node_exit_codes=_node_exit_codes(log_tail),
    )


def poll_many(profile: ClusterProfile, refs: Sequence[str]) -> dict[str, BackendStatus]:
    """Every ref's status from one ``squeue`` for all their ids and one ``sacct`` for those
    Slurm no longer shows; log tails are read only for the jobs that ended."""
    wanted: dict[str, tuple[str, Path]] = {}
    for ref in refs:
        with contextlib.suppress(PermanentError):  # not a Slurm ref: polled alone, refused
            job_id, attempt_dir = decode_ref(ref)
            wanted[ref] = (job_id, attempt_dir)
    ids = sorted({job_id for job_id, _ in wanted.values()}, key=int)
    shown = _squeue_jobs(profile, ids) if ids else {}
    forgotten = [job_id for job_id in ids if job_id not in shown]
    history = _sacct_jobs(profile, forgotten) if forgotten else {}
    statuses = {}
    for ref, (job_id, attempt_dir) in wanted.items():
        fields = shown.get(job_id) or history.get(job_id)
        if fields is None:
            statuses[ref] = _status_from_files(job_id, attempt_dir)
        else:
            statuses[ref] = _status_from_fields(fields, attempt_dir, job_id)
    return statuses


def _status_from_fields(fields: dict[str, str], attempt_dir: Path, job_id: str) -> BackendStatus:
    native_state = fields.get("JobState", "UNKNOWN")
    state = _STATES.get(native_state, BackendState.RUNNING)  # an unknown word is not an ending
    log_tail = _log_tail(attempt_dir, job_id, POLL_TAIL_LINES) if state.terminal else ""
    return BackendStatus(
        state,
        exit_code=parse_exit_code(fields.get("ExitCode", "")) if state.terminal else None,
        native_state=native_state,
        reason=_reason(fields.get("Reason", ""), log_tail),
        log_tail=log_tail,
        node_exit_codes=_node_exit_codes(log_tail),
    )


def _squeue_jobs(profile: ClusterProfile, ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """The controller's view of these jobs, ended ones it still keeps included: one RPC."""
    try:
        text = run_slurm(
            profile,
            [
                "squeue",
                "--noheader",
                "--states=all",
                f"--jobs={','.join(ids)}",
                f"--Format={SQUEUE_FORMAT}",
            ],
        )
    except UnknownJobError:  # one id, forgotten: sacct and the folder answer for it
        return {}
    return parse_squeue(text)


def _sacct_jobs(profile: ClusterProfile, ids: Sequence[str]) -> dict[str, dict[str, str]]:
    try:
        text = run_slurm(
            profile,
            ["sacct", "-j", ",".join(ids), "-n", "-P", "-o", "JobID,State,ExitCode,Reason"],
        )
    except PermanentError:  # accounting disabled or slurmdbd unreachable: there is no history
        return {}
    return parse_sacct_jobs(text)


def logs(profile: ClusterProfile, ref: str, tail_lines: int = 200) -> str:
    job_id, attempt_dir = decode_ref(ref)
    return _log_tail(attempt_dir, job_id, tail_lines)


def _log_tail(attempt_dir: Path, job_id: str, lines: int) -> str:
    try:
        return read_tail(attempt_dir.parent, log_file(attempt_dir, job_id), lines)
    except NotContained as exc:  # the job replaced its log: say so, read nothing through it
        return f"(not read: {exc})"


def log_path(ref: str, request: LaunchRequest | None = None) -> str:
    job_id, attempt_dir = decode_ref(ref)
    return str(log_file(attempt_dir, job_id))


def dump_stacks(profile: ClusterProfile, ref: str) -> str:
    """Not yet: the ranks' stacks are collected on the local backend only."""
    return "no stacks asked for: not collected on Slurm yet"


def cancel(profile: ClusterProfile, ref: str, grace_s: float = DEFAULT_GRACE_S) -> None:
    """The graceful stop, one step per call (the reconcile calls it each pass until the job has
    ended): first SIGTERM to the job's steps only, which the node script passes to the training
    processes; the first call once ``grace_s`` has passed since runs ``scancel`` (SIGTERM to
    every process, SIGKILL after KillWait); later calls send nothing. ``grace_s <= 0``: at once."""
    job_id, attempt_dir = decode_ref(ref)
    (attempt_dir / CANCEL_MARKER).touch()  # tells a later poll why, once Slurm has forgotten
    if _marker_time(attempt_dir, KILL_MARKER) is not None:
        return
    signalled_at = term_sent_at(attempt_dir)
    try:
        if grace_s <= 0 or (signalled_at is not None and time.time() - signalled_at >= grace_s):
            run_slurm(profile, ["scancel", job_id])
            _write_marker(attempt_dir, KILL_MARKER)
        elif signalled_at is None:
            _send_term(profile, job_id, attempt_dir)
    except UnknownJobError:
        return  # ended and forgotten already: nothing left to stop


def term_sent_at(attempt_dir: Path) -> float | None:
    """When the stop's SIGTERM was sent (Unix time), from the marker a worker restart keeps."""
    return _marker_time(attempt_dir, TERM_MARKER)


def _send_term(profile: ClusterProfile, job_id: str, attempt_dir: Path) -> None:
    fields = _scontrol_job(profile, job_id)
    if fields is None:
        return  # forgotten: it ended
    if _STATES.get(fields.get("JobState", "")) == BackendState.PENDING:
        # Nothing to save yet, and scancel would retry a signal to it until it timed out.
        run_slurm(profile, ["scancel", job_id])
        _write_marker(attempt_dir, KILL_MARKER)
        return
    # Without --batch or --full the batch script is not signalled: it would exit at once and
    # Slurm would end the steps with it, leaving the training no time to save.
    run_slurm(profile, ["scancel", "--signal=TERM", job_id])
    _write_marker(attempt_dir, TERM_MARKER)


def _write_marker(attempt_dir: Path, name: str) -> None:
    draft = attempt_dir / f".{name}.tmp"
    draft.write_text(f"{time.time():.3f}\n")
    draft.replace(attempt_dir / name)


def _marker_time(attempt_dir: Path, name: str) -> float | None:
    try:
        return float((attempt_dir / name).read_text())
    except (OSError, ValueError):
        return None


def encode_ref(job_id: str, attempt_dir: Path) -> str:
    return f"{job_id}:{attempt_dir}"


def decode_ref(ref: str) -> tuple[str, Path]:
    job_id, sep, folder = ref.partition(":")
    if not (sep and job_id.isdigit() and folder.startswith("/")):
        raise PermanentError(f"not a Slurm backend reference: {ref!r}")
    return job_id, Path(folder)


@contextmanager
def _submit_lock(attempt_dir: Path) -> Iterator[None]:
    with (attempt_dir / ".slurm_submit.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _existing_job(request: LaunchRequest, attempt_dir: Path) -> str | None:
    recorded = attempt_dir / JOB_ID_FILE
    if recorded.exists():
        return recorded.read_text().strip()
    # sbatch may have succeeded right before a crash that lost its answer: ask by name, and
    # adopt only a job started from this attempt's folder (sbatch runs there), not a namesake.
    listed = run_slurm(
        request.profile,
        [
            "squeue",
            "--me",
            "--noheader",
            "--states=all",
            f"--name={request.name}",
            "--format=%i %Z",
        ],
    )
    for line in listed.splitlines():
        job_id, _, work_dir = line.strip().partition(" ")
        if Path(work_dir).resolve() == attempt_dir.resolve():  # sbatch records a real path
            _record_job_id(attempt_dir, job_id)
            return job_id
    return None


def _sbatch(profile: ClusterProfile, attempt_dir: Path) -> str:
    answer = run_slurm(profile, ["sbatch", "--parsable", BATCH_SCRIPT], cwd=attempt_dir)
    job_id = answer.strip().split(";")[0]  # "<id>" or "<id>;<cluster>"
    if not job_id.isdigit():
        raise TemporaryError(f"sbatch answered {answer!r}, not a job id")
    _record_job_id(attempt_dir, job_id)
    return job_id


def _record_job_id(attempt_dir: Path, job_id: str) -> None:
    draft = attempt_dir / f".{JOB_ID_FILE}.tmp"
    draft.write_text(f"{job_id}\n")
    draft.replace(attempt_dir / JOB_ID_FILE)


def _scontrol_job(profile: ClusterProfile, job_id: str) -> dict[str, str] | None:
    try:
        line = run_slurm(profile, ["scontrol", "show", "job", "-o", job_id])
    except UnknownJobError:
        return None
    return parse_fields(line)


def _sacct_job(profile: ClusterProfile, job_id: str) -> dict[str, str] | None:
    try:
        text = run_slurm(
            profile, ["sacct", "-j", job_id, "-n", "-P", "-o", "JobID,State,ExitCode,Reason"]
        )
    except PermanentError:  # accounting disabled or slurmdbd unreachable: there is no history
        return None
    return parse_sacct(text)


def _status_from_files(job_id: str, attempt_dir: Path) -> BackendStatus:
    log_tail = _log_tail(attempt_dir, job_id, POLL_TAIL_LINES)
    exit_file = exit_code_file(attempt_dir, job_id)
    code = int(exit_file.read_text().strip() or "1") if exit_file.exists() else None
    reason = f"Slurm no longer knows job {job_id}"
    if code == 0:  # it finished before a cancel could stop it
        return BackendStatus(BackendState.SUCCEEDED, 0, reason=reason, log_tail=log_tail)
    if (attempt_dir / CANCEL_MARKER).exists():
        return BackendStatus(BackendState.CANCELLED, code, "CANCELLED", reason, log_tail)
    if code is not None:
        return BackendStatus(BackendState.FAILED, code, reason=reason, log_tail=log_tail)
    reason += " and its batch script left no exit code (killed, or its node lost)"
    return BackendStatus(BackendState.LOST, reason=reason, log_tail=log_tail)


def _reason(slurm_reason: str, log_tail: str) -> str:
    """Slurm's reason word, plus the out-of-memory kills slurmstepd saw in a step."""
    words = [] if slurm_reason in ("", "None") else [slurm_reason]
    # Slurm marks only the step, not the job, OUT_OF_MEMORY when an srun step is OOM-killed.
    words += [f"oom-kill in step {step}" for step in _STEP_OOM.findall(log_tail)]
    return "; ".join(words)


def _node_exit_codes(log_tail: str) -> dict[int, int]:
    codes: dict[int, int] = {}
    for first, last, code in _TASK_EXIT.findall(log_tail):
        for task in range(int(first), int(last or first) + 1):
            codes[task] = int(code)  # one task per node: the task id is the node rank
    return codes
