"""``zeropilot up``: the whole service on one machine, on the embedded defaults.

It migrates the database, creates the first admin (printing its token once and saving it for
the CLI), then runs a Celery worker with the reconcile scheduler in a child process and the API
in this one. Ctrl-C stops both.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from zeropilot import credentials
from zeropilot.cli_common import console


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

    import uvicorn

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
    worker = _start_worker(settings.data_dir)
    console.print(
        f"zeropilot is up: API {settings.public_url} (docs {settings.public_url}/docs)",
        highlight=False,
    )
    console.print(f"console: {settings.public_url}/console", highlight=False)
    console.print(
        f"data in {settings.data_dir}; worker log {settings.data_dir / 'worker.log'}",
        highlight=False,
    )
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        uvicorn.run(
            create_app(settings),
            host=settings.api.host,
            port=settings.api.port,
            log_level="warning",
        )
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()


def _share_metrics(folder: Path) -> None:
    """API and worker add up their Prometheus metrics in one folder, emptied at each start
    (prometheus-client's multiprocess mode; files of dead processes would count twice)."""
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        return  # the operator chose one
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)


def worker_argv(schedule: str, *extra: str) -> list[str]:
    """One Celery worker with the reconcile beat inside it: the embedded way to run workers."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.celery_app",
        "worker",
        "--beat",
        "--schedule",
        schedule,
        "--pool",
        "solo",
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        *extra,
    ]


def _start_worker(data_dir: os.PathLike[str]) -> subprocess.Popen[bytes]:
    log = open(os.path.join(data_dir, "worker.log"), "ab")  # noqa: SIM115 (the child keeps it)
    argv = worker_argv(os.path.join(data_dir, "celerybeat-schedule"))
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def _raise_interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt
