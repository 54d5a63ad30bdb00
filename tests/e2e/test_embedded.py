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
