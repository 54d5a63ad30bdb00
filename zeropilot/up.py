"""``zeropilot up``: the whole service on one machine, on the embedded defaults.

It migrates the database, creates the first admin (printing its token once and saving it for
the CLI), then runs a Celery worker and the reconcile scheduler (Celery beat) as two child
processes, as the chart and compose file run them, and the API in this one. Each child is
supervised: when it dies (a SIGKILL, the OOM killer) its whole process group goes too and a new
one starts. Ctrl-C stops them all, and the children die with this process however it ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from zeropilot import credentials
from zeropilot.cli_common import console

# Requests still running at shutdown get this long to end (a stuck one would otherwise keep
# `zeropilot up` from stopping on SIGTERM).
SHUTDOWN_GRACE_S = 5


def run_embedded(host: str | None, port: int | None) -> None:
    from service.settings import get_settings

    if host:  # through the environment, so that the worker child sees the same values
        os.environ["ZEROPILOT_API__HOST"] = host
    if port:
        os.environ["ZEROPILOT_API__PORT"] = str(port)
    get_settings.cache_clear()
    settings = get_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    _share_metrics(settings.data_dir / "prometheus")  # before anything imports the client

    from service.api.app import create_app
    from service.db.migrate import upgrade
    from service.db.session import session_scope
    from service.db.users import bootstrap_admin

    upgrade(settings.database_url)
    with session_scope(settings.database_url) as session:
        token = bootstrap_admin(session)
    if token:
        path = credentials.save(settings.public_url, token)
        console.print(
            "created user [bold]admin[/bold] in team [bold]default[/bold]; token (shown once):"
        )
        console.print(f"  {token}", highlight=False)
        console.print(f"  saved for the CLI in {path}", highlight=False)
    data = settings.data_dir
    children = [
        Supervised("worker", worker_argv(None), data / "worker.log"),
        Supervised(
            "scheduler", scheduler_argv(str(data / "celerybeat-schedule")), data / "scheduler.log"
        ),
    ]
    console.print(
        f"zeropilot is up: API {settings.public_url} (docs {settings.public_url}/docs)",
        highlight=False,
    )
    console.print(f"console: {settings.public_url}/console", highlight=False)
    console.print(
        f"data in {data}; worker log {data / 'worker.log'}, scheduler log {data / 'scheduler.log'}",
        highlight=False,
    )
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        serve_api(create_app(settings), settings.api.host, settings.api.port)
    finally:
        for child in children:
            child.stop()
        abandon_stuck_requests(128 + signal.SIGTERM)


def serve_api(app: Any, host: str, port: int) -> None:
    """Serve until SIGTERM or Ctrl-C; requests still running then get SHUTDOWN_GRACE_S to end,
    and a stuck one (its handler thread cannot be stopped) does not keep the process alive.
    Connections and request heads are bounded as in every deployment (``service.api.serve``)."""
    from service.api.serve import run_api

    run_api(app, host, port, log_level="warning", timeout_graceful_shutdown=SHUTDOWN_GRACE_S)


def abandon_stuck_requests(code: int, settle_s: float = 1.0) -> None:
    """Exit now if a request handler's thread is still running after shutdown: the interpreter
    would wait for it at exit, and a stuck one never ends. Idle pool threads are told to leave
    as the event loop ends and are gone within moments, so each gets up to ``settle_s``."""
    deadline = time.monotonic() + settle_s
    pool = [t for t in threading.enumerate() if t.name == "AnyIO worker thread"]
    for thread in pool:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    stuck = [t for t in pool if t.is_alive()]
    if stuck:
        console.print(f"{len(stuck)} request(s) still running were abandoned", highlight=False)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _share_metrics(folder: Path) -> None:
    """API and worker add up their Prometheus metrics in one folder, emptied at each start
    (prometheus-client's multiprocess mode; files of dead processes would count twice)."""
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        return  # the operator chose one
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)


def worker_argv(schedule: str | None, *extra: str) -> list[str]:
    """A Celery worker; with a schedule file, the reconcile beat runs inside it (the tests'
    stacks), without one the beat is a process of its own (``scheduler_argv``)."""
    beat = ["--beat", "--schedule", schedule] if schedule else []
    return [
        *CELERY,
        "worker",
        *beat,
        "--pool",
        "solo",
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        *extra,
    ]


def scheduler_argv(schedule: str) -> list[str]:
    """Celery beat alone: it sends the periodic reconcile task, and nothing else."""
    return [*CELERY, "beat", "--schedule", schedule, "--loglevel", "INFO"]


CELERY = [sys.executable, "-m", "celery", "-A", "workers.celery_app"]
PR_SET_PDEATHSIG = 1  # linux/prctl.h
RESTART_DELAYS_S = (1, 2, 5, 10, 30)  # a child that keeps dying is restarted ever more slowly
STABLE_AFTER_S = 60  # a child that lived this long starts the delays again from the first


class Supervised:
    """One child (the worker, or the scheduler) in a process group of its own, restarted when it
    dies; the whole group is ended on stop, or when it died, so none of its children outlive it."""

    def __init__(self, name: str, argv: list[str], log: Path, poll_s: float = 0.5) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.poll_s = poll_s
        self.restarts = 0
        self._stopping, self._stopped = threading.Event(), threading.Event()
        self.process = self._start()
        self._watcher = threading.Thread(target=self._watch, name=f"{name}-supervisor", daemon=True)
        self._watcher.start()

    def _start(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:  # the child keeps it open
            return subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own children share the group: killpg reaches them
                preexec_fn=_die_with_parent,
            )

    def _watch(self) -> None:
        failures, started = 0, time.monotonic()
        while not self._stopping.wait(self.poll_s):
            code = self.process.poll()
            if code is None:
                continue
            _end_group(self.process.pid, signal.SIGKILL)  # its orphaned children, if any
            failures = 0 if time.monotonic() - started > STABLE_AFTER_S else failures + 1
            delay = RESTART_DELAYS_S[min(failures, len(RESTART_DELAYS_S)) - 1] if failures else 0
            console.print(
                f"{self.name} exited ({code}); restarting it in {delay} s", highlight=False
            )
            if self._stopping.wait(delay):
                break
            self.process, started = self._start(), time.monotonic()
            self.restarts += 1
        # PR_SET_PDEATHSIG fires when the *thread* that started the child ends: outlive stop().
        self._stopped.wait()

    def stop(self, grace_s: float = 20) -> None:
        self._stopping.set()
        _end_group(self.process.pid, signal.SIGTERM)  # a warm shutdown
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace_s)
        _end_group(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._stopped.set()
        self._watcher.join()


def _end_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # nobody left in it
        os.killpg(pgid, sig)


def _die_with_parent() -> None:
    """In the worker child: SIGKILL when `zeropilot up` dies, even by SIGKILL."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _raise_interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt
