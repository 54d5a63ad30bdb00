"""Running Slurm's client commands (sbatch, squeue, scontrol, sacct, scancel) and reading them.

Every call goes through ``run_slurm``: the profile's SLURM_CONF, a short timeout, a small
environment (sbatch copies the caller's environment into the job, and a worker's may hold
secrets), and failures translated into the backend errors: ``TemporaryError`` when the controller
is unreachable or busy, ``PermanentError`` when Slurm rejects the request.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from service.core.clusters import ClusterProfile
from workers.backends.base import PermanentError, TemporaryError
from workers.backends.calls import count_call

COMMAND_TIMEOUT_S = 30.0
_PASSED_THROUGH = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "SLURM_CONF")
_TEMPORARY = re.compile(
    r"Unable to contact slurm controller|Socket timed out|temporarily|try again|"
    r"Connection refused|Zero Bytes were transmitted|Communication connection failure",
    re.IGNORECASE,
)
_UNKNOWN_JOB = re.compile(r"Invalid job id", re.IGNORECASE)
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z/:]*)=(\S*)")
_LAST_REAL_SIGNAL = 64  # Slurm reports OUT_OF_MEMORY as "signal" 125, which is no signal
# squeue's --Format fields, each padded to its width and ended by "|"; the reason goes last (it
# may hold spaces) and unpadded.
SQUEUE_FORMAT = "JobID:24|,State:24|,exit_code:16|,Reason:0"
_SQUEUE_KEYS = ("JobId", "JobState", "ExitCode", "Reason")


class UnknownJobError(PermanentError):
    """The controller does not know this job id (never existed, or forgotten after MinJobAge)."""


def run_slurm(profile: ClusterProfile, argv: Sequence[str], cwd: Path | None = None) -> str:
    """Run one Slurm client command and return its stdout, or raise a backend error."""
    if profile.slurm_conf and not Path(profile.slurm_conf).is_file():  # else it retries 60 s
        raise PermanentError(
            f"cluster {profile.name}'s slurm_conf {profile.slurm_conf} is not a file here"
        )
    count_call("slurm")
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            env=slurm_env(profile),
            cwd=cwd,
            timeout=COMMAND_TIMEOUT_S,
            check=True,
        )
    except FileNotFoundError as exc:
        raise PermanentError(f"{argv[0]} not found: is Slurm's client installed here?") from exc
    except subprocess.TimeoutExpired as exc:
        raise TemporaryError(f"{argv[0]} did not answer in {COMMAND_TIMEOUT_S:.0f} s") from exc
    except subprocess.CalledProcessError as exc:
        raise _translated(argv[0], exc) from exc
    return done.stdout


def slurm_env(profile: ClusterProfile) -> dict[str, str]:
    """The environment of a Slurm command, and so of the batch script that sbatch starts."""
    env = {name: os.environ[name] for name in _PASSED_THROUGH if name in os.environ}
    if profile.slurm_conf:
        env["SLURM_CONF"] = profile.slurm_conf
    return env


def parse_fields(line: str) -> dict[str, str]:
    """``Key=Value`` pairs of one ``scontrol -o`` line; the first of a repeated key wins."""
    fields: dict[str, str] = {}
    for key, value in _FIELD.findall(line):
        fields.setdefault(key, value)
    return fields


def parse_squeue(text: str) -> dict[str, dict[str, str]]:
    """``squeue --Format=SQUEUE_FORMAT`` lines by job id, keyed as ``scontrol show job`` is."""
    jobs = {}
    for line in text.splitlines():
        values = [value.strip() for value in line.split("|", len(_SQUEUE_KEYS) - 1)]
        if len(values) == len(_SQUEUE_KEYS) and values[0].isdigit():
            fields = dict(zip(_SQUEUE_KEYS, values, strict=True))
            fields["ExitCode"] = _code_and_signal(fields["ExitCode"])
            jobs[values[0]] = fields
    return jobs


def _code_and_signal(wait_status: str) -> str:
    """squeue's ``exit_code`` is the raw wait status (exit code << 8 | signal); scontrol and
    sacct write ``code:signal``."""
    if not wait_status.isdigit():
        return wait_status
    status = int(wait_status)
    return f"{status >> 8}:{status & 0x7F}"


def parse_sacct_jobs(text: str) -> dict[str, dict[str, str]]:
    """``parse_sacct`` of each job in one answer for several: its rows are the job's and its
    steps' (``<id>``, ``<id>.batch``, ``<id>.0``)."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        job_id = line.split("|", 1)[0].split(".", 1)[0]
        rows.setdefault(job_id, []).append(line)
    parsed = {job_id: parse_sacct("\n".join(lines)) for job_id, lines in rows.items()}
    return {job_id: fields for job_id, fields in parsed.items() if fields is not None}


def parse_exit_code(text: str) -> int | None:
    """Slurm's ``code:signal`` as a shell would report it (128 + signal when killed)."""
    match = re.fullmatch(r"(\d+):(\d+)", text.strip())
    if not match:
        return None
    code, signal = int(match[1]), int(match[2])
    if signal == 0:
        return code
    return 128 + signal if signal <= _LAST_REAL_SIGNAL else None


def parse_sacct(text: str) -> dict[str, str] | None:
    """The job's ``JobState``/``ExitCode`` from ``sacct -P -o JobID,State,ExitCode,Reason``.

    A job that FAILED because one of its steps ran out of memory is reported as OUT_OF_MEMORY,
    as Slurm reports the step itself.
    """
    rows = [line.split("|") for line in text.splitlines() if line.count("|") >= 3]
    if not rows:
        return None
    _, state, exit_code, reason = rows[0][:4]
    state = state.split()[0] if state.strip() else "UNKNOWN"  # "CANCELLED by 0"
    step_states = {row[1].split()[0] for row in rows[1:] if row[1].strip()}
    if state == "FAILED" and "OUT_OF_MEMORY" in step_states:
        state = "OUT_OF_MEMORY"
    return {"JobState": state, "ExitCode": exit_code, "Reason": reason}


def _translated(
    command: str, exc: subprocess.CalledProcessError
) -> PermanentError | TemporaryError:
    message = (exc.stderr or exc.stdout or "").strip() or f"exit status {exc.returncode}"
    if _UNKNOWN_JOB.search(message):
        return UnknownJobError(f"{command}: {message}")
    if _TEMPORARY.search(message):
        return TemporaryError(f"{command}: {message}")
    return PermanentError(f"{command}: {message}")
