"""What an operator sees of one job: Prometheus counters from the API and the worker processes
added up at /metrics, and JSON log lines that carry the submission's request id into the worker."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlmodel import Session

from service.db.migrate import upgrade
from service.db.session import get_engine
from service.db.users import create_user
from tests.e2e.stack import Stack, free_port
from tests.integration.helpers import auth, tiny_spec

pytestmark = pytest.mark.slow


def samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(scraped: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    """The sum over every series of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in scraped.items() if n == name and wanted <= ls)


def test_one_job_shows_in_the_counters_and_its_request_id_reaches_the_worker_log(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    upgrade(postgres_url)
    stack = Stack(tmp_path / "data", postgres_url, redis_url, log__format="json")
    with Session(get_engine(postgres_url)) as session:
        token = create_user(session, "alice", "vision")
        session.commit()
    try:
        stack.start_api()
        stack.start_worker("w1")
        http = httpx.Client(base_url=stack.url, headers=auth(token), timeout=30)
        response = http.post(
            "/v1/jobs", json=tiny_spec(steps=4), headers={"X-Request-ID": "submit-0042"}
        )
        assert response.status_code == 201, response.text
        assert response.headers["X-Request-ID"] == "submit-0042"
        job_id = response.json()["id"]
        job = _wait_for_end(http, job_id, stack)
        assert job["status"] == "SUCCEEDED", job["message"]

        scraped = samples(stack.url)
        for name in ("submitted", "admitted"):
            counted = value(scraped, f"zeropilot_jobs_{name}_total", cluster="local", team="vision")
            assert counted == 1, name
        assert value(scraped, "zeropilot_attempts_launched_total", cluster="local") == 1
        assert value(scraped, "zeropilot_jobs_finished_total", status="SUCCEEDED") == 1
        assert value(scraped, "zeropilot_submit_to_running_seconds_count", cluster="local") == 1
        assert value(scraped, "zeropilot_queue_wait_seconds_count", team="vision") == 1
        assert value(scraped, "zeropilot_jobs", cluster="local", status="SUCCEEDED") == 1
        assert value(scraped, "zeropilot_queue_depth", team="vision") == 0
        task = "zeropilot.launch_attempt"
        assert value(scraped, "zeropilot_worker_task_duration_seconds_count", task=task) >= 1
        assert value(scraped, "zeropilot_reconcile_duration_seconds_count") >= 1
        assert value(scraped, "zeropilot_advisor_duration_seconds_count", route="/v1/jobs") == 1
        assert value(scraped, "zeropilot_reconcile_last_pass_timestamp_seconds") > 0

        worker_lines = _json_lines(stack.data_dir / "worker-w1.log")
        launch = [line for line in worker_lines if line["logger"] == "workers.launch"]
        assert launch, stack.logs()
        assert launch[0]["request_id"] == "submit-0042"
        assert launch[0]["job_id"] == job_id
        assert launch[0]["attempt_id"] == job["attempts"][0]["id"]
        assert token not in (stack.data_dir / "worker-w1.log").read_text()
        assert token not in (stack.data_dir / "api.log").read_text()
    finally:
        stack.stop()


def _wait_for_end(http: httpx.Client, job_id: str, stack: Stack) -> dict:  # type: ignore[type-arg]
    import time

    deadline = time.monotonic() + 420
    while time.monotonic() < deadline:
        job: dict = http.get(f"/v1/jobs/{job_id}").json()  # type: ignore[type-arg]
        if job["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return job
        time.sleep(1)
    raise AssertionError(f"job {job_id} did not end:\n{stack.logs()}")


def _json_lines(path: Path) -> list[dict]:  # type: ignore[type-arg]
    lines = []
    for raw in path.read_text().splitlines():
        if raw.startswith("{"):
            lines.append(json.loads(raw))
    return lines


def test_a_worker_given_a_metrics_port_serves_its_own_metrics(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    """As in a worker pod, where no API runs: its reconcile passes are counted on its port."""
    import time

    upgrade(postgres_url)
    stack = Stack(tmp_path / "data", postgres_url, redis_url)
    port = free_port()
    try:
        stack.start_worker("w1", metrics_port=str(port))
        deadline, passes = time.monotonic() + 90, 0.0
        while time.monotonic() < deadline and passes < 2:
            try:
                scraped = samples(f"http://127.0.0.1:{port}")
                passes = value(scraped, "zeropilot_reconcile_duration_seconds_count")
            except httpx.TransportError:
                pass
            time.sleep(1)
        assert passes >= 2, stack.logs()
        reconciles = value(
            scraped, "zeropilot_worker_task_duration_seconds_count", task="zeropilot.reconcile"
        )
        assert reconciles >= 2
    finally:
        stack.stop()
