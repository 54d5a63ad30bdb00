"""The detached process that runs one local attempt: one DeepSpeed launcher per "node".

It outlives the Celery worker that started it (own session), so killing a worker never kills
training. It holds an exclusive lock on ``supervisor.lock`` for its whole life: the backend reads
"lock held" as running, and a second supervisor for the same attempt exits at once. The
``started`` marker makes a launch happen at most once, even after a crash.

Files in the attempt folder: ``launch.json`` (input), ``supervisor.pid``, ``started``,
``node-R.log``, ``result.json`` (exit codes, written last and atomically), ``cancel`` (request,
with the grace the worker chose). A stop sends SIGTERM to the training processes, which save and
exit; whatever is left after the grace gets SIGKILL.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, TextIO

from service.core.stopping import DEFAULT_GRACE_S
from workers.backends.oom_kills import oom_kill_count, oom_kill_evidence
from workers.backends.shm import remove_deepspeed_buffers, remove_orphaned_buffers

POLL_S = 0.5
END_REPORT_TIMEOUT_S = 5.0
FAILURE_GRACE_S = 10.0  # after one node failed, the others have nothing left to save
LOCK_WAIT_S = 2.0


def main(attempt_dir: Path) -> int:
    lock = (attempt_dir / "supervisor.lock").open("a")
    if not _acquire(lock):
        return 0  # another supervisor runs this attempt
    if (attempt_dir / "started").exists() or (attempt_dir / "cancel").exists():
        return 0  # launched before (never twice), or cancelled before it began
    (attempt_dir / "supervisor.pid").write_text(str(os.getpid()))
    (attempt_dir / "started").write_text(str(time.time()))
    launch = json.loads((attempt_dir / "launch.json").read_text())
    cancelled = _watch_for_cancel()
    kills_before = oom_kill_count()  # a SIGKILLed rank plus a rising count: the OOM killer
    nodes = [_start_node(attempt_dir, launch, node) for node in launch["nodes"]]
    (attempt_dir / "nodes.json").write_text(json.dumps([p.pid for _r, p, _l in nodes]))
    codes, first_failure = _wait(nodes, cancelled, attempt_dir)
    _clear_groups([process.pid for _rank, process, _log in nodes])
    if master := launch.get("master"):  # every rank has ended: its shared memory can go
        remove_deepspeed_buffers(master["addr"], master["port"])
    remove_orphaned_buffers()  # and those of worlds killed before their own cleanup ran
    oom_kills = oom_kill_evidence(kills_before, oom_kill_count())
    _write_result(attempt_dir, codes, first_failure, cancelled["flag"], oom_kills)
    report_end(launch["env"])
    return 0


def report_end(env: dict[str, str]) -> bool:
    """Tell the service the attempt's processes have ended, with the attempt's own token, so
    a worker records the end now; the reconcile pass stays the safety net when this fails."""
    url, attempt_id = env.get("ZEROPILOT_URL"), env.get("ZEROPILOT_ATTEMPT_ID")
    token = env.get("ZEROPILOT_ATTEMPT_TOKEN")
    if not (url and attempt_id and token and url.startswith(("http://", "https://"))):
        return False
    request = urllib.request.Request(  # noqa: S310 (the scheme is checked above)
        f"{url.rstrip('/')}/v1/runtime/attempts/{urllib.parse.quote(attempt_id)}/ended",
        method="POST",
        headers={"Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=END_REPORT_TIMEOUT_S):  # noqa: S310 (above)
            return True
    except (OSError, ValueError):  # the service is down or far: the pass will see the end
        return False


def _acquire(lock: TextIO) -> bool:
    # A status check holds the lock for an instant; retry briefly before concluding "taken".
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def _watch_for_cancel() -> dict[str, bool]:
    state = {"flag": False}

    def on_term(_signum: int, _frame: Any) -> None:
        state["flag"] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return state


def _start_node(
    attempt_dir: Path, launch: dict[str, Any], node: dict[str, Any]
) -> tuple[int, subprocess.Popen[bytes], TextIO]:
    log = (attempt_dir / f"node-{node['rank']}.log").open("a")
    process = subprocess.Popen(
        node["argv"],
        cwd=launch["cwd"],
        env=launch["env"],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: cancel kills launcher and ranks together
    )
    return node["rank"], process, log


def _wait(
    nodes: list[tuple[int, subprocess.Popen[bytes], TextIO]],
    cancelled: dict[str, bool],
    attempt_dir: Path,
) -> tuple[dict[int, int], int | None]:
    """Wait for every node; return exit codes and the rank that failed first, if any."""
    codes: dict[int, int] = {}
    first_failure: int | None = None
    stopping_since: float | None = None
    grace_s = FAILURE_GRACE_S
    while len(codes) < len(nodes):
        for rank, process, _log in nodes:
            if rank not in codes and (code := process.poll()) is not None:
                codes[rank] = 128 - code if code < 0 else code  # signal N -> 128+N, like a shell
                if codes[rank] != 0 and first_failure is None and stopping_since is None:
                    first_failure = rank
        if stopping_since is None and len(codes) < len(nodes):
            if cancelled["flag"]:  # a stop: the training saves, then exits, within the grace
                stopping_since, grace_s = time.monotonic(), requested_grace(attempt_dir)
                _signal_training(nodes, codes)
            elif first_failure is not None:
                # One node failing leaves the others blocked in collectives: stop them too.
                stopping_since = time.monotonic()
                _signal_all(nodes, codes, signal.SIGTERM)
        if stopping_since is not None and time.monotonic() - stopping_since > grace_s:
            _signal_all(nodes, codes, signal.SIGKILL)
        _wait_a_little(nodes, codes)
    for _rank, _process, log in nodes:
        log.close()
    return codes, first_failure


def _wait_a_little(
    nodes: list[tuple[int, subprocess.Popen[bytes], TextIO]], codes: dict[int, int]
) -> None:
    """Up to POLL_S, returning as soon as the first node still running exits (the end is
    reported at once, not up to a poll later); a signal (a stop) also ends the wait."""
    running = [process for rank, process, _log in nodes if rank not in codes]
    if not running:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        running[0].wait(timeout=POLL_S)


def requested_grace(attempt_dir: Path) -> float:
    """The grace the worker wrote into the stop request (``cancel``), else the default."""
    try:
        return float(json.loads((attempt_dir / "cancel").read_text())["grace_s"])
    except (OSError, ValueError, KeyError, TypeError):  # an old or empty request
        return DEFAULT_GRACE_S


def _signal_training(
    nodes: list[tuple[int, subprocess.Popen[bytes], TextIO]], done: dict[int, int]
) -> None:
    """SIGTERM to the training processes, not their launchers: DeepSpeed's launcher, signalled
    itself, kills its ranks 30 s later whatever the grace."""
    for rank, process, _log in nodes:
        if rank in done:
            continue
        targets = training_processes(process.pid)
        with contextlib.suppress(ProcessLookupError):
            if not targets:  # the ranks have not started yet: the launcher stops
                os.killpg(process.pid, signal.SIGTERM)
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def training_processes(leader: int) -> list[int]:
    """The processes of a node's group below its launcher (the leader and its children)."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:  # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # it ended while we looked
        if int(fields[2]) == leader:
            parents[int(entry.name)] = int(fields[1])
    launchers = {leader} | {pid for pid, parent in parents.items() if parent == leader}
    return sorted(pid for pid in parents if pid not in launchers)


def _signal_all(
    nodes: list[tuple[int, subprocess.Popen[bytes], TextIO]], done: dict[int, int], sig: int
) -> None:
    for rank, process, _log in nodes:
        if rank not in done:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)


def _clear_groups(groups: list[int], timeout_s: float = 10.0) -> None:
    """Kill what is left in each node's process group (ranks outliving their launcher)."""
    deadline = time.monotonic() + timeout_s
    for group in groups:
        while time.monotonic() < deadline:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                break  # the group is empty
            time.sleep(0.1)


def _write_result(
    attempt_dir: Path,
    codes: dict[int, int],
    first_failure: int | None,
    cancelled: bool,
    oom_kills: str = "",
) -> None:
    result = {
        "exit_codes": codes,
        "first_failure": first_failure,
        "cancelled": cancelled,
        "oom_kills": oom_kills,
        "at": time.time(),
    }
    draft = attempt_dir / "result.json.tmp"
    draft.write_text(json.dumps(result))
    draft.replace(attempt_dir / "result.json")


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
