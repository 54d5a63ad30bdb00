"""A job on `cluster: slurm-local` through the whole service: HTTP and CLI -> worker -> Slurm.

The local Slurm cluster has two nodes in their own network namespaces (10.77.0.11 and .12,
bridged to this host at 10.77.0.1), so the API listens on the bridge for the ranks' reports.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from service.db.migrate import upgrade
from tests.e2e.conftest import user_token
from tests.e2e.stack import Api, Stack
from tests.e2e.test_cli import zeropilot
from tests.integration.helpers import tiny_spec
from tests.integration.slurm_fixtures import LocalSlurm, slurm_profile

pytestmark = pytest.mark.slow
BRIDGE_ADDRESS = "10.77.0.1"


@pytest.fixture
def slurm_stack(
    tmp_path: Path, postgres_url: str, redis_url: str, slurm_cluster: LocalSlurm
) -> Iterator[Stack]:
    profiles = tmp_path / "clusters.yaml"
    profile = slurm_profile(slurm_cluster).model_dump(mode="json")
    profiles.write_text(yaml.safe_dump({"clusters": [profile]}))
    upgrade(postgres_url)
    stack = Stack(
        tmp_path / "data",
        postgres_url,
        redis_url,
        host="0.0.0.0",  # the ranks report from other network namespaces
        clusters__profiles_file=str(profiles),
    )
    stack.env["ZEROPILOT_API__PUBLIC_URL"] = f"http://{BRIDGE_ADDRESS}:{stack.port}"
    stack.start_api()
    stack.start_worker("w1")
    yield stack
    stack.stop()


@pytest.fixture
def slurm_token(slurm_stack: Stack, postgres_url: str) -> str:
    return user_token(postgres_url)


def test_two_node_slurm_job_trains_over_http(slurm_stack: Stack, slurm_token: str) -> None:
    api = Api(slurm_stack.url, slurm_token)
    spec = tiny_spec(steps=10, resources={"cluster": "slurm-local", "nodes": 2, "gpus_per_node": 1})
    job = api.submit(spec)
    done = api.wait_for(job["id"], {"SUCCEEDED", "FAILED"}, slurm_stack, timeout_s=600)
    assert done["status"] == "SUCCEEDED", (done["message"], slurm_stack.logs())
    attempt = done["attempts"][0]
    assert attempt["backend"] == "slurm" and attempt["backend_ref"]
    assert [m["step"] for m in done["metrics"]] == list(range(1, 11))
    assert Path(done["checkpoints"][-1]["path"]).name == "global_step10"
    logs = api.http.get(f"/v1/jobs/{job['id']}/logs", params={"tail": 400}).json()["text"]
    assert "step 10 loss" in logs


def test_slurm_job_from_the_cli(slurm_stack: Stack, slurm_token: str, tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    spec = tiny_spec(steps=6, resources={"cluster": "slurm-local", "nodes": 1, "gpus_per_node": 2})
    path.write_text(yaml.safe_dump(spec))
    result = zeropilot(slurm_stack, slurm_token, "submit", str(path), "--wait")
    assert result.returncode == 0, result.stdout + result.stderr + slurm_stack.logs()
    assert "SUCCEEDED" in result.stdout and "step     6" in result.stdout
