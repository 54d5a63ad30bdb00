"""The two scripts a Slurm attempt runs: the sbatch script and the per-node launcher script.

The sbatch script expands the job's node list into a DeepSpeed hostfile at run time, takes the
first node as master and starts one ssh-less DeepSpeed launcher per node with ``srun``; the node
script is what each of those ``srun`` tasks runs. Values in ``#SBATCH`` lines (which sbatch parses
itself, not a shell) must match strict patterns; values in shell code are ``shlex.quote``d; a
user's argument or environment value therefore reaches the training process as the same literal
string. Rendering is pure: nothing here runs a command.
"""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path

from service.core.launch_limits import ENV_NAME_PATTERN
from workers.backends.base import LaunchRequest, PermanentError
from workers.backends.shm import shell_removal
from workers.render import launcher_argv

BATCH_SCRIPT = "slurm_job.sbatch"
NODE_SCRIPT = "slurm_node.sh"
TIME_LIMIT_SIGNAL = "USR1"
DEFAULT_PYTHON = "python3"

_JOB_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # DNS-1123 label
_SLURM_WORD = re.compile(r"^[A-Za-z0-9_.,+@:-]{1,128}$")  # partition, account, QoS names
# Paths in #SBATCH lines: sbatch splits on blanks and expands %j-style patterns in them.
_DIRECTIVE_PATH = re.compile(r"^/[A-Za-z0-9_./+@:=,-]+$")
_ENV_NAME = re.compile(ENV_NAME_PATTERN)

# Shell words the launcher command takes at run time, not from the request.
_RUNTIME_WORDS = {
    "\0hostfile": '"$ZEROPILOT_HOSTFILE"',
    "\0node_rank": '"$SLURM_NODEID"',
    "\0master_addr": '"$ZEROPILOT_MASTER_ADDR"',
    "\0master_port": '"$ZEROPILOT_MASTER_PORT"',
}

# Good defaults for every rank; the profile's nccl_env and then the job's env override them.
_DEFAULT_ENV = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",  # a failed collective ends the job, not hangs it
    "ZEROPILOT_TIME_LIMIT_SIGNAL": TIME_LIMIT_SIGNAL,
}


def log_file(attempt_dir: Path, job_id: str) -> Path:
    """Where Slurm writes the job's stdout and stderr (one file: the order of lines is kept)."""
    return attempt_dir / f"slurm-{job_id}.log"


def exit_code_file(attempt_dir: Path, job_id: str) -> Path:
    """Written by the batch script when srun returns: the exit code outlives Slurm's memory."""
    return attempt_dir / f"slurm-{job_id}.exit"


def render_batch_script(request: LaunchRequest) -> str:
    """The sbatch script: resource directives, then hostfile, master and one srun step."""
    attempt_dir = _checked_directive_path(request.attempt_dir)
    low, high = request.profile.master_port_range
    if high < low:
        raise PermanentError(f"profile {request.profile.name}: master_port_range is reversed")
    directives = "".join(f"#SBATCH {option}\n" for option in sbatch_options(request))
    srun = ["srun", f"--nodes={request.nodes}", "--ntasks-per-node=1", *_step_options(request)]
    return f"""#!/bin/bash
{directives}# Rendered by zeropilot for attempt {request.name}: one DeepSpeed launcher per node.
set -uo pipefail
attempt_dir={shlex.quote(str(attempt_dir))}
export ZEROPILOT_HOSTFILE="$attempt_dir/hostfile.slurm-$SLURM_JOB_ID"
scontrol show hostnames "$SLURM_JOB_NODELIST" \\
    | sed 's/$/ slots={request.procs_per_node}/' >"$ZEROPILOT_HOSTFILE"
master_host=$(head -n 1 "$ZEROPILOT_HOSTFILE" | cut -d ' ' -f 1)
# Slurm's NodeAddr is how the cluster itself reaches a node; resolve it to an IPv4 address.
master_addr=$(scontrol show node -o "$master_host" | grep -o 'NodeAddr=[^ ]*' | cut -d = -f 2)
master_ip=$(getent ahostsv4 "${{master_addr:-$master_host}}" | awk 'NR == 1 {{print $1}}')
export ZEROPILOT_MASTER_ADDR=${{master_ip:-${{master_addr:-$master_host}}}}
export ZEROPILOT_MASTER_PORT=$(({low} + SLURM_JOB_ID % {high - low + 1}))
echo "zeropilot: nodes $(cut -d ' ' -f 1 "$ZEROPILOT_HOSTFILE" | paste -sd ' ')," \\
    "master $ZEROPILOT_MASTER_ADDR:$ZEROPILOT_MASTER_PORT"
{shlex.join(srun)} bash "$attempt_dir"/{NODE_SCRIPT}
rc=$?
printf '%s\\n' "$rc" >"$attempt_dir/slurm-$SLURM_JOB_ID.exit.tmp"
mv -f "$attempt_dir/slurm-$SLURM_JOB_ID.exit.tmp" "$attempt_dir/slurm-$SLURM_JOB_ID.exit"
exit "$rc"
"""


def render_node_script(request: LaunchRequest) -> str:
    """What each srun task runs: the job's environment, then DeepSpeed's launcher for this node."""
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in job_env(request))
    workdir = shlex.quote(_checked_value("working_dir", str(request.working_dir)))
    return f"""#!/bin/bash
# Rendered by zeropilot for attempt {request.name}: this node's DeepSpeed launcher (ssh-less).
{exports}cd -- {workdir} || {{ echo "zeropilot: no working_dir on $(hostname)" >&2; exit 127; }}
# Slurm sends its time-limit warning and a stop's SIGTERM (scancel --signal) to this task's own
# process only, not to the training processes below it: the launcher gets a process group of
# its own and the signals are passed on. Launchers ignore {TIME_LIMIT_SIGNAL} (by default it would
# end them); a training process that installs a handler for it still gets it.
set -m
(trap '' {TIME_LIMIT_SIGNAL}; exec {_launcher_command(request)}) &
launcher=$!
set +m
trap 'kill -{TIME_LIMIT_SIGNAL} -- -"$launcher" 2>/dev/null' {TIME_LIMIT_SIGNAL}
# TERM goes to the training processes, not their launchers (the group's leader and its
# children): DeepSpeed's launcher, signalled itself, kills its ranks 30 s later and exits 1.
stop_training() {{
    local ranks
    ranks=$(ps -e -o pid=,ppid=,pgid= \
        | awk -v g="$launcher" '$3 == g && $1 != g && $2 != g {{print $1}}')
    if [[ -n $ranks ]]; then
        kill -TERM $ranks 2>/dev/null
    else  # the ranks have not started yet: the launchers stop
        kill -TERM -- -"$launcher" 2>/dev/null
    fi
}}
trap stop_training TERM
while :; do
    wait "$launcher"
    rc=$?
    kill -0 "$launcher" 2>/dev/null || break  # wait was only interrupted by a signal
done
# DeepSpeed's CPU all-reduce never unlinks its shared memory (66 MiB per rank).
{shell_removal('"$ZEROPILOT_MASTER_ADDR"', '"$ZEROPILOT_MASTER_PORT"')}
exit "$rc"
"""


def sbatch_options(request: LaunchRequest) -> list[str]:
    """The ``#SBATCH`` options, each already checked against what sbatch would misparse."""
    profile = request.profile
    log = str(log_file(_checked_directive_path(request.attempt_dir), "%j"))
    options = [
        f"--job-name={_checked(_JOB_NAME, 'name', request.name)}",
        f"--nodes={request.nodes}",
        "--ntasks-per-node=1",
        *_step_options(request),
        f"--mem={math.ceil(profile.cpu_memory_gib * 1024)}M",
        f"--output={log}",
        f"--error={log}",
        # zeropilot, not Slurm, decides whether a lost attempt runs again (from its checkpoint).
        "--no-requeue",
        "--open-mode=append",  # an admin's requeue keeps the first run's lines
        f"--signal={TIME_LIMIT_SIGNAL}@{signal_lead_s(request.time_limit_s)}",
    ]
    if request.time_limit_s is not None:
        options.append(f"--time={max(1, math.ceil(request.time_limit_s / 60))}")
    for option, value in (("partition", profile.partition), ("account", profile.account)):
        if value is not None:
            options.append(f"--{option}={_checked(_SLURM_WORD, option, value)}")
    if profile.qos is not None:
        options.append(f"--qos={_checked(_SLURM_WORD, 'qos', profile.qos)}")
    return options


def signal_lead_s(time_limit_s: int | None) -> int:
    """How long before the time limit the training is warned: a tenth of it, 10 s to 5 min."""
    return 300 if time_limit_s is None else max(10, min(300, time_limit_s // 10))


def job_env(request: LaunchRequest) -> list[tuple[str, str]]:
    """Every variable exported to each rank, in a stable order: defaults, profile, job."""
    merged = {**_DEFAULT_ENV, **request.profile.nccl_env, **request.env}
    for name, value in merged.items():
        _checked(_ENV_NAME, "environment variable name", name)
        _checked_value(f"environment variable {name}", value)
    return sorted(merged.items())


def _step_options(request: LaunchRequest) -> list[str]:
    # srun repeats these: Slurm 22.05's srun no longer inherits --cpus-per-task from the job.
    cpus = request.profile.cpus_per_node or request.procs_per_node
    options = [f"--cpus-per-task={cpus}"]
    if request.profile.accelerator != "cpu":
        options.append(f"--gpus-per-node={request.procs_per_node}")
    return options


def _launcher_command(request: LaunchRequest) -> str:
    argv = launcher_argv(
        python=_checked_value("python", request.python or DEFAULT_PYTHON),
        hostfile="\0hostfile",
        node_rank="\0node_rank",
        master_addr="\0master_addr",
        master_port="\0master_port",
        entrypoint=_checked_value("entrypoint", request.entrypoint),
        args=[_checked_value("argument", arg) for arg in request.args],
        ds_config=_checked_value("ds_config_path", str(request.ds_config_path)),
    )
    return " ".join(_RUNTIME_WORDS.get(word) or shlex.quote(word) for word in argv)


def _checked(pattern: re.Pattern[str], what: str, value: str) -> str:
    if not pattern.fullmatch(value):
        raise PermanentError(
            f"{what} {value!r} is not allowed on Slurm (must match {pattern.pattern})"
        )
    return value


def _checked_value(what: str, value: str) -> str:
    if "\0" in value:  # no argv or environment entry can hold a NUL byte
        raise PermanentError(f"{what} contains a NUL byte")
    return value


def _checked_directive_path(path: Path) -> Path:
    absolute = path.absolute()
    _checked(_DIRECTIVE_PATH, "attempt folder", str(absolute))
    return absolute
