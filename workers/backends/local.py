"""The local backend: DeepSpeed on this machine, one ssh-less launcher per "node".

Several nodes on one machine are several launchers with different node ranks that meet at
127.0.0.1: a real multi-node launch, minus the network. A detached supervisor process
(``local_supervisor``) owns the launchers; this module only writes its input and reads its files,
so the Celery worker never waits on training.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from service.contained_files import NotContained
from service.core.clusters import ClusterProfile
from service.core.failures import SIGKILL_EXIT_CODES
from service.core.stopping import DEFAULT_GRACE_S
from service.logtail import tail_lines as read_tail
from workers.backends.base import (
    BackendState,
    BackendStatus,
    LaunchRequest,
    PermanentError,
    poll_each,
)
from workers.backends.local_supervisor import training_processes
from workers.render import (
    launcher_argv,
    make_private_dir,
    render_hostfile,
    write_json_once,
)

# Variables a training process needs from the worker's environment; nothing else leaks through
# (the worker's own settings may hold database passwords).
_PASSED_THROUGH = (
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "PYTHONPATH",
    "TORCH_EXTENSIONS_DIR",
    "CUDA_VISIBLE_DEVICES",
    "VIRTUAL_ENV",
)


def submit(request: LaunchRequest) -> str:
    attempt_dir = make_private_dir(request.attempt_dir)
    entry = Path(request.entrypoint)
    if not request.working_dir.is_dir():  # else the supervisor dies in chdir, saying nothing
        raise PermanentError(f"working_dir {str(request.working_dir)!r} is not a folder here")
    if not (entry if entry.is_absolute() else request.working_dir / entry).is_file():
        raise PermanentError(
            f"entrypoint {request.entrypoint!r} not found in {request.working_dir}"
        )
    write_json_once(attempt_dir / "launch.json", _launch_plan(request))
    if not (attempt_dir / "started").exists() and not _supervisor_alive(attempt_dir):
        _spawn_supervisor(attempt_dir)
    return str(attempt_dir)


def poll(profile: ClusterProfile, ref: str) -> BackendStatus:
    attempt_dir = Path(ref)
    alive = _supervisor_alive(attempt_dir)  # before reading the result: it is written, then exits
    result_file = attempt_dir / "result.json"
    if result_file.exists():
        return _finished(attempt_dir, json.loads(result_file.read_text()))
    if alive:
        return BackendStatus(BackendState.RUNNING, native_state="running")
    if (attempt_dir / "started").exists():
        return BackendStatus(
            BackendState.LOST,
            native_state="supervisor-gone",
            reason="the local supervisor process ended without recording exit codes",
            log_tail=_tail(attempt_dir, 80),
        )
    if (attempt_dir / "cancel").exists():
        return BackendStatus(BackendState.CANCELLED, native_state="cancelled-before-start")
    return BackendStatus(BackendState.PENDING, native_state="starting")


def poll_many(profile: ClusterProfile, refs: Sequence[str]) -> dict[str, BackendStatus]:
    """Each attempt folder's files, as ``poll`` reads them: there is no cluster to ask."""
    return poll_each(poll, profile, refs)


def logs(profile: ClusterProfile, ref: str, tail_lines: int = 200) -> str:
    return _tail(Path(ref), tail_lines)


def _tail(attempt_dir: Path, tail_lines: int) -> str:
    files = sorted(attempt_dir.glob("node-*.log"))
    parts = []
    for path in files:
        try:
            text = read_tail(attempt_dir.parent, path, tail_lines)
        except NotContained as exc:  # the job replaced its log: say so, read nothing through it
            text = f"(not read: {exc})"
        header = [f"==> {path.name} <=="] if len(files) > 1 else []
        parts.append("\n".join(header + text.splitlines()))
    return "\n".join(parts)


def cancel(profile: ClusterProfile, ref: str, grace_s: float = DEFAULT_GRACE_S) -> None:
    attempt_dir = Path(ref)
    # A supervisor that has not started will not start; a running one reads the grace here.
    (attempt_dir / "cancel").write_text(json.dumps({"grace_s": grace_s}))
    if (attempt_dir / "result.json").exists():
        return
    if _supervisor_alive(attempt_dir):
        pid = int((attempt_dir / "supervisor.pid").read_text())
        os.kill(pid, signal.SIGTERM)  # it stops every node's process group, then records codes
        return
    for pid in json.loads(_read(attempt_dir / "nodes.json") or "[]"):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def dump_stacks(profile: ClusterProfile, ref: str) -> str:
    """SIGUSR1 to every rank (not their launchers, which it would end)."""
    ranks = [
        pid
        for leader in json.loads(_read(Path(ref) / "nodes.json") or "[]")
        for pid in training_processes(int(leader))
    ]
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
    return f"asked its {len(ranks)} training processes for their stacks (in their logs)"


def log_path(ref: str, request: LaunchRequest | None = None) -> str:
    """The log a user reads first: node 0's, where rank 0 prints."""
    return str(Path(ref) / "node-0.log")


def _launch_plan(request: LaunchRequest) -> dict[str, Any]:
    hosts = [f"node-{rank}" for rank in range(request.nodes)]
    hostfile = request.attempt_dir / "hostfile"
    hostfile.write_text(render_hostfile(hosts, request.procs_per_node))
    port = str(_free_port())
    python = request.python or sys.executable
    nodes = [
        {
            "rank": rank,
            "argv": launcher_argv(
                python=python,
                hostfile=str(hostfile),
                node_rank=str(rank),
                master_addr="127.0.0.1",
                master_port=port,
                entrypoint=request.entrypoint,
                args=request.args,
                ds_config=str(request.ds_config_path),
            ),
        }
        for rank in range(request.nodes)
    ]
    env = {k: v for k, v in os.environ.items() if k in _PASSED_THROUGH}
    env.update(request.profile.nccl_env)
    env.update(request.env)
    master = {"addr": "127.0.0.1", "port": port}
    return {"nodes": nodes, "cwd": str(request.working_dir), "env": env, "master": master}


def _spawn_supervisor(attempt_dir: Path) -> None:
    with (attempt_dir / "supervisor.log").open("a") as log:
        subprocess.Popen(
            [sys.executable, "-m", "workers.backends.local_supervisor", str(attempt_dir)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the worker: training outlives a worker restart
            close_fds=True,
        )


def _supervisor_alive(attempt_dir: Path) -> bool:
    lock_file = attempt_dir / "supervisor.lock"
    if not lock_file.exists():
        return False
    with lock_file.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(lock, fcntl.LOCK_UN)
        return False


def _finished(attempt_dir: Path, result: dict[str, Any]) -> BackendStatus:
    codes = {int(rank): int(code) for rank, code in result["exit_codes"].items()}
    first = result.get("first_failure")
    exit_code = codes[int(first)] if first is not None else max(codes.values(), default=0)
    if result.get("cancelled"):
        state = BackendState.CANCELLED
    else:
        state = BackendState.SUCCEEDED if exit_code == 0 else BackendState.FAILED
    return BackendStatus(
        state,
        exit_code=exit_code,
        native_state=f"exit {exit_code}",
        reason=str(result.get("oom_kills", "")) if exit_code in SIGKILL_EXIT_CODES else "",
        log_tail=_tail(attempt_dir, 80) if exit_code else "",
        node_exit_codes=codes,
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None
