"""`zeropilot up` on the embedded defaults (SQLite, SQLite-backed broker, local backend)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.stack import free_port
from tests.integration.helpers import REPO

pytestmark = pytest.mark.slow


class Embedded:
    def __init__(self, home: Path) -> None:
        self.port = free_port()
        self.env = {
            key: value for key, value in os.environ.items() if not key.startswith("ZEROPILOT_")
        }
        self.env.update(
            ZEROPILOT_DATA_DIR=str(home / "data"),
            ZEROPILOT_API__PORT=str(self.port),
            XDG_CONFIG_HOME=str(home / "config"),
        )
        self.output = home / "up.log"

    def up(self) -> subprocess.Popen[bytes]:
        with self.output.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "zeropilot.cli", "up"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/readyz").status_code == 200:
                    return process
            except httpx.TransportError:
                time.sleep(0.3)
        raise AssertionError(self.output.read_text())

    def down(self, process: subprocess.Popen[bytes]) -> None:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "zeropilot.cli", *argv],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Embedded]:
    yield Embedded(tmp_path)


def test_up_creates_the_admin_once_and_trains_the_example(
    embedded: Embedded, tmp_path: Path
) -> None:
    process = embedded.up()
    try:
        first_output = embedded.output.read_text()
        assert "token (shown once)" in first_output
        saved = json.loads((tmp_path / "config" / "zeropilot" / "credentials.json").read_text())
        assert saved["token"] in first_output
        assert (
            oct((tmp_path / "config" / "zeropilot" / "credentials.json").stat().st_mode)[-3:]
            == "600"
        )

        spec = yaml.safe_load((REPO / "examples" / "tiny-gpt.yaml").read_text())
        spec["args"] = ["--steps", "6", "--checkpoint-interval", "3"]
        spec["working_dir"] = str(REPO / "examples")
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
        result = embedded.cli("submit", str(tmp_path / "job.yaml"), "--wait")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCEEDED" in result.stdout and "step     6" in result.stdout
    finally:
        embedded.down(process)

    again = embedded.up()
    try:
        assert "token (shown once)" not in embedded.output.read_text()
        listing = json.loads(embedded.cli("list", "--json").stdout)
        assert [job["status"] for job in listing["data"]] == ["SUCCEEDED"]
    finally:
        embedded.down(again)


def process_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, process group, command line) of every live process."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue  # ended while we looked
        if fields[0] != "Z":  # a zombie is dead, only not yet reaped
            table[int(stat.parent.name)] = (int(fields[1]), int(fields[2]), cmdline)
    return table


def wait_for_child(up: subprocess.Popen[bytes], role: str, not_pid: int = 0) -> int:
    """The pid of `zeropilot up`'s Celery child whose subcommand is ``role`` ("worker" or
    "beat"), other than ``not_pid``."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for pid, (parent, _group, cmdline) in process_table().items():
            if parent == up.pid and pid != not_pid and f" {role} " in f"{cmdline} ":
                return pid
        time.sleep(0.5)
    raise AssertionError(f"no celery {role} under zeropilot up")


def test_up_restarts_a_killed_worker_or_scheduler_and_leaves_no_orphan(
    embedded: Embedded, tmp_path: Path
) -> None:
    process = embedded.up()
    try:
        worker, scheduler = wait_for_child(process, "worker"), wait_for_child(process, "beat")

        os.kill(worker, signal.SIGKILL)  # as the kernel's OOM killer would
        os.kill(scheduler, signal.SIGKILL)

        new_worker = wait_for_child(process, "worker", not_pid=worker)
        new_scheduler = wait_for_child(process, "beat", not_pid=scheduler)
        worker_log = tmp_path / "data" / "worker.log"
        restarted_at = worker_log.stat().st_size
        output = embedded.output.read_text()
        assert "worker exited (-9); restarting" in output
        assert "scheduler exited (-9); restarting" in output
        spec = yaml.safe_load((REPO / "examples" / "tiny-gpt.yaml").read_text())
        spec["args"] = ["--steps", "2", "--checkpoint-interval", "2"]
        spec["working_dir"] = str(REPO / "examples")
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
        result = embedded.cli("submit", str(tmp_path / "job.yaml"), "--wait")
        assert result.returncode == 0, result.stdout + result.stderr  # the new worker works
        # The new scheduler sends the periodic reconcile, and the new worker runs it.
        deadline = time.monotonic() + 60
        while "zeropilot.reconcile" not in worker_log.read_bytes()[restarted_at:].decode():
            assert time.monotonic() < deadline, "no reconcile ran after the restarts"
            time.sleep(1)
    finally:
        embedded.down(process)
    left = set(process_table())
    assert not {worker, scheduler, new_worker, new_scheduler} & left, "a child outlived `up`"
