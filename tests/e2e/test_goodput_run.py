"""A real tiny job with checkpoint.interval_steps: auto, drained once, through the running
stack: the ranks follow zeropilot's interval (rank 0 hears it, all agree each step), the stop
saves and the next attempt goes on from there, the events say why the interval, and
`zeropilot status`, `zeropilot report` and /metrics show where the GPU time went."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.stack import Api, Stack
from tests.e2e.test_cli import zeropilot
from tests.e2e.test_graceful_stop import wait_for_steps
from tests.integration.helpers import tiny_spec

pytestmark = pytest.mark.slow


def exported_gpu_seconds(url: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            if sample.name == "zeropilot_gpu_seconds_total":
                found[sample.labels["cause"]] = sample.value
    return found


def drain(stack: Stack, attempt: dict[str, str]) -> None:
    """SIGTERM to the attempt's supervisor, as a node drain sends it."""
    supervisor = stack.data_dir / "attempts" / attempt["backend_name"] / "supervisor.pid"
    os.kill(int(supervisor.read_text()), signal.SIGTERM)


def test_a_drained_auto_interval_job_shows_its_gpu_time(stack: Stack, api: Api, token: str) -> None:
    stack.start_worker("w1")
    spec = tiny_spec("auto-cadence", steps=40, checkpoint={"interval_steps": "auto"})
    spec["args"] = ["--steps", "40"]  # no --checkpoint-interval: zeropilot's
    job = api.submit(spec)
    wait_for_steps(api, job["id"], 3, stack)
    drain(stack, api.job(job["id"])["attempts"][0])
    deadline = time.monotonic() + 400
    while (detail := api.job(job["id"]))["status"] != "SUCCEEDED":
        assert time.monotonic() < deadline and detail["status"] != "FAILED", stack.logs()
        time.sleep(1.0)

    first, second = detail["attempts"]
    assert first["status"] == "PREEMPTED" and second["status"] == "SUCCEEDED"
    reasons = [e["reason"] for e in detail["events"]]
    assert any(r.startswith("checkpoint every ") for r in reasons), reasons
    goodput = detail["goodput"]
    by_attempt = {a["number"]: a for a in goodput["attempts"]}
    assert by_attempt[1]["lost_gpu_seconds"]["stop_save"] > 0  # the drain's save and exit
    assert by_attempt[1]["productive_gpu_seconds"] > 0  # its steps were resumed from
    assert goodput["mfu"] > 0
    lost = sum(goodput["lost_gpu_seconds"].values())
    # Each figure is rounded to the millisecond: their sum to within a few.
    assert goodput["gpu_seconds"] == pytest.approx(
        goodput["productive_gpu_seconds"] + lost, abs=0.01
    )

    status = zeropilot(stack, token, "status", job["id"])
    report = zeropilot(stack, token, "report", "--team", "vision", "--since", "1h")
    print(status.stdout, report.stdout)  # docs/goodput.md shows a run's
    assert "GPU time:" in status.stdout and "MFU:" in status.stdout
    assert "1 jobs" in report.stdout
    exported = exported_gpu_seconds(stack.url)
    assert exported["productive"] == pytest.approx(goodput["productive_gpu_seconds"], abs=0.01)
