"""The whole service as real processes: uvicorn serving the API and Celery workers with beat."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.integration.helpers import REPO
from zeropilot.up import worker_argv


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Stack:
    """API and workers configured through ZEROPILOT_* variables, as an operator would run them."""

    def __init__(
        self,
        data_dir: Path,
        database_url: str,
        broker_url: str,
        host: str = "127.0.0.1",
        **settings: str,
    ) -> None:
        self.data_dir = data_dir
        self.host = host
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "ZEROPILOT_DATA_DIR": str(data_dir),
            "ZEROPILOT_DB__URL": database_url,
            "ZEROPILOT_BROKER__URL": broker_url,
            "ZEROPILOT_AUTH__SECRET_KEY": "e2e-secret",
            "ZEROPILOT_API__PORT": str(self.port),
            "ZEROPILOT_WORKERS__RECONCILE_INTERVAL_S": "1",
            "ZEROPILOT_WORKERS__LAUNCH_LEASE_S": "5",
            # API and workers add up their Prometheus metrics here, as zeropilot up sets it.
            "PROMETHEUS_MULTIPROC_DIR": str(data_dir / "prometheus"),
            **{f"ZEROPILOT_{key.upper()}": value for key, value in settings.items()},
        }
        self.processes: list[subprocess.Popen[bytes]] = []

    def start_api(self, port: int | None = None) -> str:
        """Serve the API on this stack's port, or another API process on ``port``; its URL."""
        port = port or self.port
        argv = [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "service.api.app:create_app",
            "--host",
            self.host,
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        self._spawn(argv, "api.log" if port == self.port else f"api-{port}.log", {})
        url = f"http://127.0.0.1:{port}"
        self._wait_ready(url)
        return url

    def start_worker(self, name: str, **settings: str) -> subprocess.Popen[bytes]:
        extra = {f"ZEROPILOT_WORKERS__{key.upper()}": value for key, value in settings.items()}
        argv = worker_argv(str(self.data_dir / f"beat-{name}"), "--hostname", f"{name}@%h")
        return self._spawn(argv, f"worker-{name}.log", extra)

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL the process and everything in its group, as a crashed host would."""
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)

    def logs(self) -> str:
        return "\n".join(
            f"==> {path.name} <==\n{path.read_text(errors='replace')[-4000:]}"
            for path in sorted(self.data_dir.glob("*.log"))
        )

    def _spawn(
        self, argv: list[str], log_name: str, extra: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        (self.data_dir / "prometheus").mkdir(parents=True, exist_ok=True)
        with (self.data_dir / log_name).open("ab") as log:
            process = subprocess.Popen(
                argv,
                cwd=REPO,
                env={**self.env, **extra},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_the_test_run,
            )
        self.processes.append(process)
        return process

    def _wait_ready(self, url: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"API did not become ready:\n{self.logs()}")


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_the_test_run() -> None:
    """Stack processes get SIGKILL when the test run that started them dies, even by SIGKILL:
    an orphaned worker would otherwise take the next run's tasks from the shared Redis."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Api:
    """A tiny authenticated HTTP client for the tests."""

    def __init__(self, url: str, token: str) -> None:
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        response = self.http.post("/v1/jobs", json=spec)
        assert response.status_code == 201, response.text
        result: dict[str, Any] = response.json()
        return result

    def job(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.http.get(f"/v1/jobs/{job_id}").json()
        return result

    def wait_for(
        self, job_id: str, statuses: set[str], stack: Stack, timeout_s: float = 420
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["status"] in statuses:
                return job
            time.sleep(1)
        raise AssertionError(f"job {job_id} stuck in {job['status']}:\n{stack.logs()}")
