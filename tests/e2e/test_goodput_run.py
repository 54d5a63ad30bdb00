"""A real tiny job with checkpoint.interval_steps: auto, through the running stack: the ranks
follow zeropilot's interval (rank 0 hears it, all agree each step), the events say why, and
`zeropilot status`, `zeropilot report` and /metrics show where its GPU time went."""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.stack import Stack
from tests.e2e.test_cli import zeropilot
from tests.integration.helpers import tiny_spec

pytestmark = pytest.mark.slow


def exported_gpu_seconds(url: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            if sample.name == "zeropilot_gpu_seconds_total":
                found[sample.labels["cause"]] = sample.value
    return found


def test_an_auto_interval_job_shows_its_gpu_time(stack: Stack, token: str, tmp_path: str) -> None:
    stack.start_worker("w1")
    spec = tiny_spec("auto-cadence", steps=30, checkpoint={"interval_steps": "auto"})
    spec["args"] = ["--steps", "30"]  # no --checkpoint-interval: zeropilot's
    path = f"{tmp_path}/job.json"
    with open(path, "w") as out:
        json.dump(spec, out)
    submitted = zeropilot(stack, token, "submit", path, "--wait")
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr + stack.logs()
    job_id = json.loads(zeropilot(stack, token, "list", "--json").stdout)["data"][0]["id"]

    job = json.loads(zeropilot(stack, token, "status", job_id, "--json").stdout)
    reasons = [e["reason"] for e in job["events"]]
    assert any(r.startswith("checkpoint every ") for r in reasons), reasons
    assert [c["step"] for c in job["checkpoints"]] == [30]  # 10 min apart: only the final one
    goodput = job["goodput"]
    assert goodput["productive_gpu_seconds"] > 0 and goodput["mfu"] > 0
    lost = sum(goodput["lost_gpu_seconds"].values())
    assert goodput["gpu_seconds"] == pytest.approx(goodput["productive_gpu_seconds"] + lost)

    status = zeropilot(stack, token, "status", job_id)
    report = zeropilot(stack, token, "report", "--team", "vision", "--since", "1h")
    print(status.stdout, report.stdout)  # docs/goodput.md shows a run's
    assert "GPU time:" in status.stdout and "MFU:" in status.stdout
    assert "1 jobs" in report.stdout
    exported = exported_gpu_seconds(stack.url)
    assert exported["productive"] == pytest.approx(goodput["productive_gpu_seconds"], abs=0.01)
